package cmd

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/withlock/withlock/internal/lock"
)

// releaseFlags are the flags of withlock release.
type releaseFlags struct {
	connFlags
	handleFlags
	force   bool
	timeout time.Duration
}

func newReleaseCmd(env *environment) *cobra.Command {
	f := &releaseFlags{}
	c := &cobra.Command{
		Use:   "release --force [flags] NAME",
		Short: "Break NAME's lock, whoever holds it; or end a handle's",
		Long: `release --force breaks the lock of every current holder of NAME, in every
mode. Each holder sees the loss, stops its command (TERM, then KILL after its
--kill-after) and exits 70. --force is required: without it release changes
nothing and exits 64. See who holds NAME first, with withlock status NAME.

HOW EACH BACKEND BREAKS A LOCK

- PostgreSQL: ends the holders' sessions (pg_terminate_backend), found by
  NAME's keys, whoever took them; everything else in those sessions ends
  too. Needs the holders' role, pg_signal_backend or a superuser.
- MySQL: ends the holders' sessions (KILL CONNECTION). Another user's
  session needs CONNECTION_ADMIN or SUPER.
- Redis: deletes NAME's hash of leases and wakes the waiters; the fencing
  counter stays. Holders notice at their next renewal, within ttl/3.
- MongoDB: inserts the next document of NAME's chain with no holders.
  Holders notice at their next renewal.
- etcd: revokes the holders' leases, which deletes their keys.
- Kubernetes: clears the holder of NAME's Leases, keeping leaseTransitions.
- S3: writes a free record over NAME's objects, keeping the count of
  acquisitions. Holders notice at their next renewal.
- file: signals the holding withlock on this host (signal 42), after
  checking it is that withlock. A holder that is not a withlock (flock(1)),
  or on another host, is left alone: exit 75.

It waits up to --timeout for the holders to let go.

RELEASING A HANDLE

release --handle H (or --handle-file F) ends the lock that withlock acquire
took and printed H for: its keeper releases NAME and ends. It never
releases a lock that is no longer the handle's, and needs no --force. On
another host than the keeper's, or for acquire --detach lease, it releases
the lease through the backend; a session lock (PostgreSQL, MySQL, file)
only its keeper's host can release.

ENVIRONMENT

- WITHLOCK_DB, PG_CONNECTION_STRING: the backend URL when --db is not given.
- SSL_CERT_FILE, SSL_CERT_DIR, KUBECONFIG: as for withlock(1).

EXIT STATUS

- 0: those who held NAME no longer do; it says on stderr whom it broke, or
  that nothing was held. With --handle: the handle's lock was released.
- 64: usage, including a missing --force.
- 69: the backend is unavailable, or the break is not allowed.
- 70: with --handle: the handle no longer held its lock (released already,
  lost, run out, broken, or taken since); it says why.
- 75: the lock could not be broken within --timeout.`,
		Example: `  withlock status dbmigration            # see who holds it first
  withlock release --force dbmigration
  withlock release --handle "$H"        # a lock withlock acquire took`,
		Args: func(_ *cobra.Command, args []string) error {
			if f.handleFlags.given() {
				if len(args) > 0 {
					return usagef("release --handle takes no NAME: the handle names it")
				}
				return nil
			}
			if len(args) != 1 {
				return usagef("release takes one NAME, not %d arguments: withlock release --force NAME", len(args))
			}
			return nil
		},
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(c *cobra.Command, args []string) error {
			if err := f.prepare(env); err != nil {
				return err
			}
			if f.handleFlags.given() {
				if f.force {
					return usagef("--force breaks whoever holds NAME; --handle ends only the handle's lock: give one of them")
				}
				_, err := openHandle(env, &f.connFlags, &f.handleFlags, func(ctx context.Context, client *lock.Client, h handle) error {
					return releaseHandle(ctx, client, h, f.timeout)
				})
				return err
			}
			if !f.force {
				return usagef("release breaks the lock of whoever holds %q, who then stops its command (exit 70); say --force to do it", args[0])
			}
			client, err := f.open(env)
			if err != nil {
				return err
			}
			defer client.Close()
			ctx, cancel := context.WithTimeout(context.Background(), f.connectTimeout+f.timeout)
			defer cancel()
			broken, err := client.Break(ctx, args[0])
			if err != nil {
				return err
			}
			log := env.logger()
			if len(broken) == 0 {
				log.Info(fmt.Sprintf("%q was not held", args[0]))
				return nil
			}
			var who []string
			for _, h := range broken {
				who = append(who, describeHolder(h))
			}
			log.Info(fmt.Sprintf("broke %q, held by %s", args[0], strings.Join(who, "; ")))
			return nil
		},
	}
	f.connFlags.register(c.Flags())
	f.handleFlags.register(c.Flags())
	completeFlags(c)
	c.ValidArgsFunction = f.completeHeld(env)
	oneAttempt(c.Flags())
	c.Flags().BoolVar(&f.force, "force", false, "break the lock, whoever holds it (required)")
	c.Flags().DurationVar(&f.timeout, "timeout", 10*time.Second, "how long to wait for the holders to let go")
	return c
}
