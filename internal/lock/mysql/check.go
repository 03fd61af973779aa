package mysql

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/withlock/withlock/internal/lock"
)

// Findings reports what weakens a lock on this server beyond what taking one
// refuses (withlock check): a replica that is not read-only (Server.Warning,
// as a holder is warned), a lone Galera node, and whether status can show
// who holds a lock (performance_schema).
func (b *backend) Findings(ctx context.Context, probe string) ([]lock.Finding, error) {
	var out []lock.Finding
	err := b.withAux(ctx, func(c *sql.Conn) error {
		s, err := Detect(ctx, c)
		if err != nil {
			return err
		}
		switch w := s.Warning(b.addr); {
		case w != "":
			out = append(out, lock.Finding{Name: "replica", Status: lock.Warn, Detail: w})
		case s.Galera:
			out = append(out, lock.Finding{Name: "galera", Status: lock.Ok,
				Detail: fmt.Sprintf("mysql at %s is a Galera node alone in its cluster, which withlock treats as a plain server; a second node joining ends every lock held there", b.addr)})
		default:
			out = append(out, lock.Finding{Name: "primary", Status: lock.Ok,
				Detail: fmt.Sprintf("mysql at %s is writable and replicates from no other server", b.addr)})
		}
		var mdl sql.NullBool
		err = c.QueryRowContext(ctx, mdlEnabledSQL).Scan(&mdl)
		if err != nil || !mdl.Bool {
			// MariaDB's plugin is the other source List can read.
			if _, perr := c.ExecContext(ctx, "SELECT 1 FROM information_schema.METADATA_LOCK_INFO LIMIT 0"); perr == nil {
				err, mdl.Bool = nil, true
			}
		}
		if err != nil || !mdl.Bool {
			why := "performance_schema is off or its instrument wait/lock/metadata/sql/mdl is disabled"
			if err != nil {
				why = "this user cannot read performance_schema (" + err.Error() + ")"
			}
			out = append(out, lock.Finding{Name: "status", Status: lock.Warn,
				Detail: fmt.Sprintf("withlock status without NAME cannot list the locks at %s: %s; status NAME still works", b.addr, why),
				Fix:    "turn performance_schema and the instrument on (MySQL 8: on by default), or on MariaDB INSTALL SONAME 'metadata_lock_info'"})
		} else {
			out = append(out, lock.Finding{Name: "status", Status: lock.Ok, Detail: "performance_schema shows who holds each lock"})
		}
		return nil
	})
	return out, err
}
