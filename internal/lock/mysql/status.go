package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/withlock/withlock/internal/lock"
)

// What status can know depends on the server:
//
//   - Who holds a key: IS_USED_LOCK gives the connection's id, on every
//     server, to every user.
//   - What that connection is: information_schema.PROCESSLIST gives its
//     client address, to its own user or one with the PROCESS privilege.
//   - withlock's record (host, pid, command, mode, N; @withlock) and when
//     it acquired (@withlock_at), and other clients' connection attributes
//     (_pid, program_name): performance_schema's user_variables_by_thread
//     and session_connect_attrs, where performance_schema is on (MySQL's
//     default, not MariaDB's) and the user may read it.
//   - Every lock held (List): performance_schema.metadata_locks, where the
//     metadata-lock instrument is on (MySQL 8's default), else MariaDB's
//     information_schema.METADATA_LOCK_INFO (plugin metadata_lock_info).

// slotsSQL lists the slots of a name that are held, 0 to MaxHolders-1
// (without a recursive CTE, which MySQL 5.7 lacks), and their holders'
// connection ids: $1 is Key, $2 the slot prefix.
var slotsSQL = sync.OnceValue(func() string {
	digit := "(SELECT 0 AS n UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 " +
		"UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)"
	return fmt.Sprintf(`SELECT s.i, s.id FROM (
	SELECT d.i, IS_USED_LOCK(IF(d.i = 0, ?, CONCAT(?, d.i))) AS id
	FROM (SELECT a.n + 10 * b.n + 100 * c.n AS i FROM %[1]s a CROSS JOIN %[1]s b CROSS JOIN %[1]s c) d
	WHERE d.i < %[2]d) s
WHERE s.id IS NOT NULL ORDER BY s.i`, digit, MaxHolders)
})

// holdersSQL tells what is known of connections $1..: id, client
// address, @withlock, @withlock_at, and the attributes _pid and
// program_name. It is formatted with the ids' derived table.
const holdersSQL = `SELECT x.id, p.HOST, v.VARIABLE_VALUE, w.VARIABLE_VALUE, a.ATTR_VALUE, n.ATTR_VALUE
FROM (%s) x
LEFT JOIN information_schema.PROCESSLIST p ON p.ID = x.id
LEFT JOIN performance_schema.threads t ON t.PROCESSLIST_ID = x.id
LEFT JOIN performance_schema.user_variables_by_thread v ON v.THREAD_ID = t.THREAD_ID AND v.VARIABLE_NAME = 'withlock'
LEFT JOIN performance_schema.user_variables_by_thread w ON w.THREAD_ID = t.THREAD_ID AND w.VARIABLE_NAME = 'withlock_at'
LEFT JOIN performance_schema.session_connect_attrs a ON a.PROCESSLIST_ID = x.id AND a.ATTR_NAME = '_pid'
LEFT JOIN performance_schema.session_connect_attrs n ON n.PROCESSLIST_ID = x.id AND n.ATTR_NAME = 'program_name'`

// holdersPlainSQL is holdersSQL for a user who may not read
// performance_schema, or a server without it.
const holdersPlainSQL = `SELECT x.id, p.HOST, NULL, NULL, NULL, NULL
FROM (%s) x
LEFT JOIN information_schema.PROCESSLIST p ON p.ID = x.id`

// holder is a connection that holds a key.
type holder struct {
	id  int64
	rec *holderRecord // nil when it is not withlock's, or cannot be seen
	lock.Holder
}

// slots returns the connection ids holding name's slots, by slot.
func slots(ctx context.Context, c *sql.Conn, name string) (map[int]int64, error) {
	rows, err := c.QueryContext(ctx, slotsSQL(), Key(name), slotPrefix(name))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	held := map[int]int64{}
	for rows.Next() {
		var i int
		var id int64
		if err := rows.Scan(&i, &id); err != nil {
			return nil, err
		}
		held[i] = id
	}
	return held, rows.Err()
}

// describe returns what can be known of the connections ids.
func describe(ctx context.Context, c *sql.Conn, ids []int64) (map[int64]holder, error) {
	out := map[int64]holder{}
	if len(ids) == 0 {
		return out, nil
	}
	var table strings.Builder
	args := make([]any, len(ids))
	for i, id := range ids {
		if i > 0 {
			table.WriteString(" UNION ALL ")
		}
		table.WriteString("SELECT CAST(? AS SIGNED) AS id")
		args[i] = id
	}
	rows, err := c.QueryContext(ctx, fmt.Sprintf(holdersSQL, table.String()), args...)
	var myErr *gomysql.MySQLError
	if errors.As(err, &myErr) {
		// No performance_schema, or not for this user: the processlist only.
		rows, err = c.QueryContext(ctx, fmt.Sprintf(holdersPlainSQL, table.String()), args...)
	}
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			id                 int64
			addr, pid, program sql.NullString
			record, acquiredAt []byte
		)
		if err := rows.Scan(&id, &addr, &record, &acquiredAt, &pid, &program); err != nil {
			return nil, err
		}
		h := holder{id: id}
		var rec holderRecord
		if len(record) > 0 && json.Unmarshal(record, &rec) == nil {
			h.rec = &rec
			h.Host, h.PID, h.Command = rec.Host, rec.PID, rec.Command
			if t, err := time.Parse("2006-01-02 15:04:05.999999", string(acquiredAt)); err == nil {
				h.AcquiredAt = t
			}
		} else {
			// Another client: its address, and what its attributes say.
			h.Host = clientHost(addr.String)
			h.PID, _ = strconv.Atoi(pid.String)
			if program.String != "" {
				h.Command = []string{program.String}
			}
		}
		out[id] = h
	}
	return out, rows.Err()
}

// clientHost is the host of a processlist HOST, "10.0.0.5:51234".
func clientHost(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// state is name's State from its held slots and what is known of their
// holders.
func state(name string, held map[int]int64, who map[int64]holder) lock.State {
	st := lock.State{Name: name}
	if len(held) == 0 {
		return st
	}
	st.Key, st.Mode = Key(name), lock.Exclusive
	for _, i := range slices.Sorted(maps.Keys(held)) {
		h := who[held[i]]
		if h.id == 0 {
			h.id = held[i]
		}
		st.Holders = append(st.Holders, h.Holder)
		if i > 0 {
			st.Mode = lock.Semaphore
		}
		if h.rec != nil && h.rec.Mode == lock.Semaphore {
			st.Mode, st.MaxHolders = lock.Semaphore, h.rec.MaxHolders
		}
	}
	return st
}

// Inspect finds name's holders with IS_USED_LOCK on every slot key, and
// describes them with what the server shows (see above).
func (b *backend) Inspect(ctx context.Context, name string) (lock.State, error) {
	var st lock.State
	err := b.withAux(ctx, func(c *sql.Conn) error {
		held, err := slots(ctx, c, name)
		if err != nil {
			return err
		}
		who, err := describe(ctx, c, slices.Collect(maps.Values(held)))
		if err != nil {
			return err
		}
		st = state(name, held, who)
		b.warnTrap(ctx, c)
		return nil
	})
	return st, err
}

// warnTrap warns, for status, of a server where withlock would refuse a
// lock or warn of one (see Server): "free" there does not mean that a lock
// could be taken.
func (b *backend) warnTrap(ctx context.Context, c *sql.Conn) {
	s, err := Detect(ctx, c)
	if err != nil {
		b.opts.Log.Debug("could not tell what kind of server this is", "err", err)
		return
	}
	if _, what, _ := s.trap(); what != "" {
		b.opts.Log.Warn(fmt.Sprintf("mysql at %s %s: withlock refuses to take a lock there", b.addr, what))
	}
	if w := s.Warning(b.addr); w != "" {
		b.opts.Log.Warn(w)
	}
}

// Lock sources for List, best first.
const (
	// metadataLocksSQL needs performance_schema with the instrument
	// wait/lock/metadata/sql/mdl (on by default in MySQL 8; in MySQL 5.7
	// and MariaDB: performance-schema-instrument='wait/lock/metadata/sql/mdl=ON').
	metadataLocksSQL = `SELECT m.OBJECT_NAME, t.PROCESSLIST_ID
FROM performance_schema.metadata_locks m JOIN performance_schema.threads t ON t.THREAD_ID = m.OWNER_THREAD_ID
WHERE m.OBJECT_TYPE = 'USER LEVEL LOCK' AND m.LOCK_STATUS = 'GRANTED'
	AND @@performance_schema
	AND (SELECT ENABLED FROM performance_schema.setup_instruments WHERE NAME = 'wait/lock/metadata/sql/mdl') = 'YES'`
	mdlEnabledSQL = `SELECT @@performance_schema AND (SELECT ENABLED FROM performance_schema.setup_instruments WHERE NAME = 'wait/lock/metadata/sql/mdl') = 'YES'`
	// lockInfoSQL needs MariaDB's plugin metadata_lock_info (INSTALL
	// SONAME 'metadata_lock_info'); its THREAD_ID is the connection's id.
	lockInfoSQL = `SELECT TABLE_SCHEMA, THREAD_ID FROM information_schema.METADATA_LOCK_INFO WHERE LOCK_TYPE = 'User lock'`
)

// errCannotList says what List needs.
func (b *backend) errCannotList() error {
	return lock.Errorf(lock.ErrNotSupported, "mysql at %s cannot list its locks: that needs performance_schema with the instrument wait/lock/metadata/sql/mdl "+
		"(MySQL 8: on by default) and the right to read it, or on MariaDB the plugin metadata_lock_info (INSTALL SONAME 'metadata_lock_info'); "+
		"withlock status NAME works without them", b.addr)
}

// List lists every user-level lock held, withlock's (by name, as their
// holders recorded it) and other clients' (by key), from the best source
// the server has (see above).
func (b *backend) List(ctx context.Context) ([]lock.State, error) {
	var states []lock.State
	err := b.withAux(ctx, func(c *sql.Conn) error {
		type pair struct {
			key string
			id  int64
		}
		var pairs []pair
		collect := func(query string) (bool, error) {
			rows, err := c.QueryContext(ctx, query)
			var myErr *gomysql.MySQLError
			if errors.As(err, &myErr) {
				return false, nil // not this source
			}
			if err != nil {
				return false, err
			}
			defer rows.Close()
			for rows.Next() {
				var p pair
				if err := rows.Scan(&p.key, &p.id); err != nil {
					return false, err
				}
				pairs = append(pairs, p)
			}
			return true, rows.Err()
		}
		ok, err := collect(metadataLocksSQL)
		if err == nil && ok && len(pairs) == 0 {
			// No row: no lock, or no instrument to see one.
			var on sql.NullBool
			if c.QueryRowContext(ctx, mdlEnabledSQL).Scan(&on) != nil || !on.Bool {
				ok = false
			}
		}
		if err == nil && !ok {
			ok, err = collect(lockInfoSQL)
		}
		switch {
		case err != nil:
			return err
		case !ok:
			return b.errCannotList()
		}
		ids := make([]int64, 0, len(pairs))
		for _, p := range pairs {
			ids = append(ids, p.id)
		}
		who, err := describe(ctx, c, slices.Compact(slices.Sorted(slices.Values(ids))))
		if err != nil {
			return err
		}
		// A withlock holder's record names the lock; other locks are shown
		// by key.
		byName := map[string]map[int]int64{}
		var others []lock.State
		for _, p := range pairs {
			h := who[p.id]
			if h.rec != nil && h.rec.Name != "" {
				if i, ok := slotOf(h.rec.Name, p.key); ok {
					if byName[h.rec.Name] == nil {
						byName[h.rec.Name] = map[int]int64{}
					}
					byName[h.rec.Name][i] = p.id
					continue
				}
			}
			if h.id == 0 {
				h.id = p.id
			}
			others = append(others, lock.State{Key: p.key, Mode: lock.Exclusive, Holders: []lock.Holder{h.Holder}})
		}
		for _, name := range slices.Sorted(maps.Keys(byName)) {
			states = append(states, state(name, byName[name], who))
		}
		states = append(states, others...)
		b.warnTrap(ctx, c)
		return nil
	})
	return states, err
}

// slotOf says which slot of name key is, if any.
func slotOf(name, key string) (int, bool) {
	if key == Key(name) {
		return 0, true
	}
	rest, ok := strings.CutPrefix(key, slotPrefix(name))
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	return i, err == nil && i > 0 && i < MaxHolders
}
