package mysql

import (
	"context"
	"database/sql"
	"errors"
	"maps"
	"slices"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/withlock/withlock/internal/lock"
)

// breakPoll is how often Break checks that the connections it killed let
// go: the server ends a killed session at its next check, within moments.
const breakPoll = 10 * time.Millisecond

// Break ends the session of every holder of name's slots with KILL, which
// needs the CONNECTION_ADMIN or SUPER privilege (MariaDB: CONNECTION ADMIN
// or SUPER) for other users' sessions, and returns once none of them holds
// a slot any more (bounded by ctx). Without the privilege it fails with
// ErrRefused and the server's reason.
func (b *backend) Break(ctx context.Context, name string) ([]lock.Holder, error) {
	var broken []lock.Holder
	err := b.withAux(ctx, func(c *sql.Conn) error {
		held, err := slots(ctx, c, name)
		if err != nil || len(held) == 0 {
			return err
		}
		who, err := describe(ctx, c, slices.Collect(maps.Values(held)))
		if err != nil {
			return err
		}
		st := state(name, held, who)
		for _, id := range slices.Compact(slices.Sorted(maps.Values(held))) {
			_, err := c.ExecContext(ctx, "KILL CONNECTION ?", id)
			var myErr *gomysql.MySQLError
			switch {
			case errors.As(err, &myErr) && myErr.Number == 1094:
				// Unknown thread: it ended meanwhile.
			case errors.As(err, &myErr):
				return lock.Errorf(lock.ErrRefused, "mysql at %s did not let us end connection %d, which holds %q: %s (error %d); "+
					"run withlock release --force as a user with the CONNECTION_ADMIN or SUPER privilege (MariaDB: CONNECTION ADMIN), or as the holder's user",
					b.addr, id, name, myErr.Message, myErr.Number)
			case err != nil:
				return err
			}
		}
		broken = st.Holders
		t := time.NewTicker(breakPoll)
		defer t.Stop()
		for {
			now, err := slots(ctx, c, name)
			if err != nil {
				return err
			}
			left := 0
			for i, id := range now {
				if held[i] == id {
					left++
				}
			}
			if left == 0 {
				return nil
			}
			select {
			case <-ctx.Done():
				return lock.Errorf(lock.ErrHeld, "mysql at %s: %d connections killed for %q still held it when time ran out", b.addr, left, name)
			case <-t.C:
			}
		}
	})
	if err != nil {
		return nil, err
	}
	return broken, nil
}
