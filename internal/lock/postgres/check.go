package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/withlock/withlock/internal/lock"
)

// Findings reports what weakens a lock on this server beyond what taking one
// refuses (a standby, a transaction pool; withlock check): whether the
// server can end a frozen holder's session (idle_session_timeout,
// PostgreSQL 14), and whether a session pool is in between.
func (b *backend) Findings(ctx context.Context, probe string) ([]lock.Finding, error) {
	conn, err := b.connect(ctx, probe)
	if err != nil {
		return nil, err
	}
	var version string
	var idle bool
	err = conn.QueryRow(ctx, `select pg_catalog.current_setting('server_version'),
		pg_catalog.current_setting('idle_session_timeout', true) is not null`, pgx.QueryExecModeSimpleProtocol).Scan(&version, &idle)
	if err != nil {
		return nil, b.failed(err)
	}
	var out []lock.Finding
	if idle {
		out = append(out, lock.Finding{Name: "server-side bound", Status: lock.Ok,
			Detail: fmt.Sprintf("postgres %s at %s ends a holder's session once it has been silent for the ttl (idle_session_timeout), so a frozen or cut-off holder frees the lock", version, b.addr)})
	} else {
		out = append(out, lock.Finding{Name: "server-side bound", Status: lock.Warn,
			Detail: fmt.Sprintf("postgres %s at %s has no idle_session_timeout (PostgreSQL 14 and later): TCP keepalives end a cut-off holder's session, but a frozen holder keeps the lock until it is resumed or killed", version, b.addr),
			Fix:    "upgrade to PostgreSQL 14 or later"})
	}
	if b.pooled {
		out = append(out, lock.Finding{Name: "pooler", Status: lock.Ok,
			Detail: fmt.Sprintf("a pooler at %s gives each client a server session of its own (session mode), reset between clients; each lock costs two to four connections to it", b.addr)})
	}
	return out, nil
}
