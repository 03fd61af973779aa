package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"

	"github.com/withlock/withlock/internal/lock"
)

// A server can grant GET_LOCK and still exclude nobody: a replica grants
// it on itself only, and so does every node of a Galera cluster (user-level
// locks are not replicated). What the server says of itself, to any user:
//
//   - read_only (which super_read_only turns on) and innodb_read_only (how
//     Aurora's readers say so): a replica, or a primary that a failover
//     demoted. withlock trusts read_only as the sign of a replica.
//   - The status wsrep_provider_name, wsrep_cluster_size,
//     wsrep_cluster_status and wsrep_ready: a Galera node (a provider is
//     loaded; whether wsrep_on replicates writes or not, its GET_LOCK is
//     local), how many nodes its cluster has, and whether it is in the
//     cluster's Primary component and serving. MySQL has neither those
//     nor wsrep_on, so they are read with SHOW, which works on both.
//   - Slave_running and Slaves_running (MariaDB): this server replicates
//     from another. A master-master pair does so on both sides, so that is
//     a warning, not a refusal.
//
// detectSQL reads all of it, with no privilege, in result sets of (name,
// value) rows. It runs after GET_LOCK in the same packet (lockSQL), so a
// lock granted after a wait is checked before it is used; alone, it is
// Detect. SHOW GLOBAL STATUS costs the server more than the rest of the
// packet, so it runs on the first packet of a connection and, on a Galera
// node, on every one; elsewhere later packets
// read only read_only (readOnlySQL), since the provider is loaded at
// start-up (wsrep_provider is not dynamic) and a restart ends the session.
const (
	readOnlySQL = `SELECT 'read_only', @@global.read_only OR @@global.innodb_read_only`
	detectSQL   = readOnlySQL + `;
SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_provider_name', 'wsrep_cluster_size', 'wsrep_cluster_status', 'wsrep_ready', 'Slave_running', 'Slaves_running')`
)

// Server is what a MySQL or MariaDB server says of itself that decides
// whether a lock there excludes everyone who uses it. Detect reads it.
type Server struct {
	// ReadOnly: read_only, super_read_only or innodb_read_only is on.
	ReadOnly bool
	// Galera: a Galera provider is loaded. The fields below are its
	// cluster's size, wsrep_cluster_status ("Primary", "non-Primary",
	// "Disconnected") and wsrep_ready.
	Galera        bool
	ClusterSize   int
	ClusterStatus string
	Ready         bool
	// Replicating: the server replicates from another (MariaDB's
	// Slave_running or Slaves_running).
	Replicating bool
}

// recheckSQL is what the lock's connection reads of its server after a
// grant and at every check: all of it (detectSQL) until the connection's
// first packet has said that the server is not a Galera node, then only
// read_only (see detectSQL).
func (b *backend) recheckSQL() string {
	if b.server == nil || b.server.Galera {
		return detectSQL
	}
	return readOnlySQL
}

// Detect reads what the server of c says of itself (see Server). It needs
// no privilege; status and withlock check (Findings) call it as
// acquisition does.
func Detect(ctx context.Context, c *sql.Conn) (Server, error) {
	rows, err := c.QueryContext(ctx, detectSQL)
	if err != nil {
		return Server{}, err
	}
	defer rows.Close()
	return readServer(rows, true)
}

// readServer reads detectSQL's result sets from rows: from the current one
// if first, else from the next.
func readServer(rows *sql.Rows, first bool) (Server, error) {
	vars := map[string]string{}
	for more := first || rows.NextResultSet(); more; more = rows.NextResultSet() {
		for rows.Next() {
			var name, value sql.NullString
			if err := rows.Scan(&name, &value); err != nil {
				return Server{}, err
			}
			vars[strings.ToLower(name.String)] = value.String
		}
	}
	if err := rows.Err(); err != nil {
		return Server{}, err
	}
	on := func(name string) bool {
		v := strings.ToUpper(vars[name])
		return v == "ON" || v == "1"
	}
	s := Server{
		ReadOnly:      on("read_only"),
		Galera:        vars["wsrep_provider_name"] != "",
		ClusterStatus: vars["wsrep_cluster_status"],
		Ready:         on("wsrep_ready"),
		Replicating:   on("slave_running"),
	}
	s.ClusterSize, _ = strconv.Atoi(vars["wsrep_cluster_size"])
	if n, _ := strconv.Atoi(vars["slaves_running"]); n > 0 {
		s.Replicating = true
	}
	return s, nil
}

// trap says why a lock on s would exclude nobody, and what to do, or
// ("", "") when it would exclude everyone; kind is ErrRefused for what
// lasts, ErrUnavailable for a Galera node that is starting, or split off,
// and may come back (it is then refused if its cluster has other nodes). A
// Galera node alone in its cluster, in the Primary component and ready, is
// a plain server: its clients are all the lock's users there are.
func (s Server) trap() (kind error, what, fix string) {
	switch {
	case s.ReadOnly:
		return lock.ErrRefused, "is read-only (read_only, super_read_only or innodb_read_only is on: a replica?), where a lock excludes nobody on the primary",
			"point withlock at the primary"
	case s.Galera && s.ClusterSize > 1:
		return lock.ErrRefused, fmt.Sprintf("is a node of a Galera cluster of %d nodes, where GET_LOCK holds on one node only and excludes nobody on the others", s.ClusterSize),
			"point withlock at a MySQL or MariaDB server outside the cluster, or use another backend"
	case s.Galera && (s.ClusterStatus != "Primary" || !s.Ready):
		return lock.ErrUnavailable, fmt.Sprintf("is a Galera node out of its cluster's Primary component (wsrep_cluster_status %s, wsrep_ready %s), where other nodes may grant the same lock",
				orNone(s.ClusterStatus), onOff(s.Ready)),
			"point withlock at a MySQL or MariaDB server outside the cluster, or use another backend"
	}
	return nil, "", ""
}

// Refusal is the error of a lock attempt on s, with why and what to do, or
// nil when a lock at addr would exclude everyone: ErrRefused (exit 69 at
// once) for a read-only server or a Galera cluster of more than one node;
// ErrUnavailable (retried for --connect-timeout, then 69) for a Galera
// node out of the Primary component or not ready.
func (s Server) Refusal(addr string) error {
	kind, what, fix := s.trap()
	if what == "" {
		return nil
	}
	if kind == lock.ErrRefused {
		return lock.Unsafe(fmt.Sprintf("mysql at %s %s", addr, what), fix)
	}
	return lock.Errorf(kind, "mysql at %s %s; %s", addr, what, fix)
}

// Warning is what a holder on s is told on stderr, or "": a server that
// replicates from another and is not read-only may be a replica that
// nobody made read-only, whose locks its primary never sees; or one side of
// a master-master pair, which is fine.
func (s Server) Warning(addr string) string {
	if !s.Replicating || s.ReadOnly {
		return ""
	}
	return fmt.Sprintf("mysql at %s replicates from another server (Slave_running) and is not read-only: if it is a replica, a lock there excludes nobody on its primary; "+
		"point withlock at the primary, or set read_only on the replica (withlock trusts read_only); one side of a master-master pair may ignore this", addr)
}

// loss is the error of a check while held when s has become a trap: the
// lock no longer excludes everyone (ErrLost), or nil.
func (s Server) loss(addr string) error {
	switch {
	case s.ReadOnly:
		return lock.Errorf(lock.ErrLost, "mysql at %s is read-only now (a failover?), where the lock excludes nobody on the primary", addr)
	case s.Galera && s.ClusterSize > 1:
		return lock.Errorf(lock.ErrLost, "mysql at %s is now a node of a Galera cluster of %d nodes (another node joined), where the lock excludes nobody on the others", addr, s.ClusterSize)
	case s.Galera && (s.ClusterStatus != "Primary" || !s.Ready):
		return lock.Errorf(lock.ErrLost, "mysql at %s left its Galera cluster's Primary component (wsrep_cluster_status %s, wsrep_ready %s), where other nodes may grant the lock too",
			addr, orNone(s.ClusterStatus), onOff(s.Ready))
	}
	return nil
}

func onOff(b bool) string {
	if b {
		return "ON"
	}
	return "OFF"
}

func orNone(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
