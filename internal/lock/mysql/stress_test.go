package mysql_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// TestModesStress: 16 contenders, each with one client: 6 take one name
// exclusively, 10 a semaphore of 3 on another (the modes this backend
// has). One acquisition in ten ends as if its host died: its session is
// killed with KILL, nobody releases, and the client connects again for its
// next round. The exclusive lock is never held twice, and the semaphore
// never has 4 holders.
func TestModesStress(t *testing.T) {
	m := testenv.RequireMariaDB(t)
	locktest.Stress{
		URL: m.URL,
		Contenders: append(
			locktest.Repeat(6, locktest.Contender{Name: "x"}),
			locktest.Repeat(10, locktest.Contender{Name: "sem", Options: lock.Options{Mode: lock.Semaphore, MaxHolders: 3}})...),
		Rounds: 25,
		TTL:    3 * time.Second,
		// Its session is the one whose record names its pid.
		Crash: func(t *testing.T, c *lock.Client, name string, token int64) {
			ids, err := testenv.MySQLExec(locktest.Context(t), m.URL, fmt.Sprintf(`SELECT t.PROCESSLIST_ID
				FROM performance_schema.user_variables_by_thread v JOIN performance_schema.threads t USING (THREAD_ID)
				WHERE v.VARIABLE_NAME = 'withlock' AND JSON_VALUE(v.VARIABLE_VALUE, '$.pid') = %d`, c.Options().Holder.PID))
			if err != nil || len(ids) != 1 {
				t.Errorf("the session of holder %d: %q, %v", c.Options().Holder.PID, ids, err)
				return
			}
			if _, err := testenv.MySQLExec(locktest.Context(t), m.URL, "KILL "+ids[0]); err != nil {
				t.Errorf("KILL %s: %v", ids[0], err)
			}
		},
	}.Run(t)
}
