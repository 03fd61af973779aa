package postgres_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/withlock/withlock/internal/lock"
	"github.com/withlock/withlock/internal/lock/locktest"
	"github.com/withlock/withlock/internal/testenv"
)

// TestModesStress: 16 contenders, each with a client per mode: 8 mix
// shared and exclusive holders of one name, 8 hold a semaphore of 3 on
// another, now and then exclusively; one acquisition in ten ends as if its
// host died (the session is killed, no release, nobody NOTIFYs; the client
// then connects again). The semaphore never has 4 holders, shared never
// overlaps exclusive, exclusive is always alone.
func TestModesStress(t *testing.T) {
	db := database(t, testenv.RequirePostgres(t))
	locktest.Stress{
		URL:        db,
		Contenders: locktest.Mixed(),
		Rounds:     25,
		TTL:        3 * time.Second,
		Crash: func(t *testing.T, c *lock.Client, name string, token int64) {
			query(t, db, fmt.Sprintf("select pg_terminate_backend(pid, 30000) from pg_stat_activity where application_name like 'withlock %d@%%'", c.Options().Holder.PID))
		},
	}.Run(t)
}
