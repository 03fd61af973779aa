package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// ErrNoGalera is returned by [StartGaleraNode] when MariaDB's Galera
// provider or rsync (its state transfer) is not installed.
var ErrNoGalera = errors.New("testenv: the Galera provider (/usr/lib/galera/libgalera_smm.so) or rsync not found; install them with: apt-get install galera-4 rsync mariadb-server (or run scripts/test-deps as root)")

// galeraProvider is where Debian's galera-4 puts the provider.
const galeraProvider = "/usr/lib/galera/libgalera_smm.so"

// StartGaleraNode starts a MariaDB server that is a node of a Galera
// cluster on loopback: a new cluster of its own when join is nil, else a
// node that joins join's cluster and receives its state by rsync. It
// returns once the node is Synced. Each node has its own ports (the
// server's, Galera's group port, and those of state transfers).
func StartGaleraNode(join *MariaDB) (*MariaDB, error) {
	if _, err := os.Stat(galeraProvider); err != nil || findProgram("rsync", "/usr/bin") == "" {
		return nil, ErrNoGalera
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	group, ist, sst := ports[0], ports[1], ports[2]
	address := "gcomm://"
	var args []string
	if join == nil {
		args = []string{"--wsrep-new-cluster"}
	} else {
		address += fmt.Sprintf("127.0.0.1:%d", join.galeraPort)
	}
	// A node that stops answering is out of the cluster within seconds
	// (suspected after 3s, inactive after 5s; the defaults are 5s and 15s),
	// so that a test that freezes one sees the others leave the Primary
	// component soon, while a node that a busy machine starves of CPU for
	// a second or two is not taken for gone.
	conf := fmt.Sprintf(`wsrep-on = ON
wsrep-provider = %[1]s
wsrep-cluster-name = withlock
wsrep-cluster-address = %[2]s
wsrep-node-address = 127.0.0.1:%[3]d
wsrep-node-incoming-address = 127.0.0.1
wsrep-sst-method = rsync
wsrep-sst-receive-address = 127.0.0.1:%[4]d
wsrep-provider-options = "gmcast.listen_addr=tcp://127.0.0.1:%[3]d;ist.recv_addr=127.0.0.1:%[5]d;gcache.size=8M;evs.suspect_timeout=PT3S;evs.inactive_timeout=PT5S;evs.inactive_check_period=PT0.5S;evs.keepalive_period=PT0.5S;pc.wait_prim_timeout=PT5S"
binlog-format = ROW
default-storage-engine = InnoDB
innodb-autoinc-lock-mode = 2
`, galeraProvider, address, group, sst, ist)
	m, err := StartMariaDB(MariaDBOptions{Conf: conf, Args: args})
	if err != nil {
		return nil, err
	}
	m.galeraPort = group
	if err := m.WaitStatus("wsrep_local_state_comment", "Synced"); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// RequireGaleraNode is [StartGaleraNode] for t.
func RequireGaleraNode(t testing.TB, join *MariaDB) *MariaDB {
	m, err := StartGaleraNode(join)
	return require(t, m, err, ErrNoGalera)
}

// WaitStatus waits up to a minute for the server's status variable name
// to read value.
func (m *MariaDB) WaitStatus(name, value string) error {
	var last []string
	var err error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		last, err = MySQLExec(ctx, m.URL, fmt.Sprintf("SHOW GLOBAL STATUS LIKE '%s'", name))
		cancel()
		if err == nil && len(last) == 1 && strings.EqualFold(last[0], name+" "+value) {
			return nil
		}
	}
	return fmt.Errorf("testenv: %s of the MariaDB on port %d is not %s after a minute (last: %q, %v)", name, m.Port, value, last, err)
}

// freePorts returns n ports as FreePort does.
func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		var err error
		if ports[i], err = FreePort(); err != nil {
			return nil, err
		}
	}
	return ports, nil
}
