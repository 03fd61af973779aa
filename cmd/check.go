package cmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/withlock/withlock/internal/lock"
)

// checkFlags are the flags of withlock check.
type checkFlags struct {
	connFlags
	json     bool
	sharedFS bool
}

// errCheckFailed is the outcome of a check that found a lock would not
// exclude everyone (exit 78); the findings have said why.
var errCheckFailed = errors.New("a check failed")

func newCheckCmd(env *environment) *cobra.Command {
	f := &checkFlags{}
	c := &cobra.Command{
		Use:   "check [flags]",
		Short: "Check that a lock on the backend would exclude everyone",
		Long: `check answers one question before a deploy or a cron fleet depends on the
backend: would a lock there exclude everyone who uses it? It connects, takes
and releases a probe lock on a name of its own (withlock-check- and 12 hex
digits) through the same code that taking a lock uses, so every refusal
withlock makes when it takes a lock is a failed check here, in the same
words. Then it runs every check that applies to the backend, and removes
what the probe left behind: its lock file (file://), its records (MongoDB),
its fencing counter (Redis).

Unlike taking a lock, check does not retry an unreachable backend: a
refused connection is exit 69 at once. --connect-timeout bounds the whole
check.

OUTPUT

One line per check on stdout: the verdict, the check's name, what it found
and, after "; ", what to do about it. With --json, one JSON object: backend,
url (never with its password), ok (no check failed), and checks, each with
name, status (the verdict), detail and fix (empty when there is nothing to
do). When the backend cannot be reached or refuses withlock, --json prints
that object too, ok false and one failed check named connect, and the exit
status is 69.

VERDICTS

- ok: nothing wrong was found. Some ok lines say a fact worth knowing: a
  pooler in session mode, a Galera node alone in its cluster.
- warn: a lock works there, but something weakens it, or a fact could not
  be read (a managed server that hides a setting). A restart, a failover or
  eviction can forget a lock on a Redis without appendonly or wait_replicas,
  or one that evicts keys, and on a MongoDB standalone server or with a
  write concern below a majority. A PostgreSQL before 14 leaves a frozen
  holder its lock. A MySQL server that replicates from another and is not
  read-only may be a replica. withlock status without NAME cannot list a
  MySQL server's locks without performance_schema. A file:// directory is
  on a network file system that --fs-shares-locks says shares its locks.
- fail: a lock there would not exclude everyone who uses it: a PostgreSQL
  hot standby, a pooler that shares server sessions between clients, a
  read-only MySQL server, a node of a Galera cluster of more than one node,
  a Redis replica, a node of a Redis Cluster, a file:// directory on a
  network file system. withlock refuses to take a lock on every one of them
  but the last (exit 69).

ENVIRONMENT

- WITHLOCK_DB, PG_CONNECTION_STRING: the backend URL when --db is not given.
- SSL_CERT_FILE, SSL_CERT_DIR, KUBECONFIG: as for withlock(1).

EXIT STATUS

- 0: no check failed (warnings allowed).
- 64: usage: a bad URL, an argument.
- 69: the backend cannot be reached, or refuses the credentials or the
  rights a lock needs; a Galera node out of its cluster's Primary component.
- 78: a check failed: a lock there would not exclude everyone.`,
		Example: `  withlock check --db postgres://ops@db.internal/app
  withlock check && withlock dbmigration -- migrate up     # in a deploy script, with WITHLOCK_DB set
  withlock check --db file:///mnt/locks --fs-shares-locks  # an NFS mount whose locks every host shares
  withlock check --json --db redis://cache.internal | jq '.checks[] | select(.status != "ok")'`,
		Args:          noArgs("check"),
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(c *cobra.Command, args []string) error {
			client, err := f.openWith(env, lock.Options{SharedFS: f.sharedFS})
			if err != nil {
				return f.unreached(env, err)
			}
			defer client.Close()
			ctx, cancel := context.WithTimeout(context.Background(), f.connectTimeout)
			defer cancel()
			findings, err := client.Check(ctx)
			if err != nil {
				return f.unreached(env, err)
			}
			failed := f.print(env.stdout, findings)
			if failed {
				return reported{errCheckFailed}
			}
			return nil
		},
	}
	f.connFlags.register(c.Flags())
	completeFlags(c)
	oneAttempt(c.Flags())
	c.Flags().BoolVar(&f.json, "json", false, "print one JSON object")
	c.Flags().BoolVar(&f.sharedFS, "fs-shares-locks", false, "file://: the directory's network file system shares its locks between every host that uses it (a warning, not a failure)")
	return c
}

// unreached returns err, a failure to reach or use the backend, after
// printing, with --json, the object a script expects: ok false and one
// failed check, connect, that says why. The exit status stays 69.
func (f *checkFlags) unreached(env *environment, err error) error {
	if f.json && f.db != "" && (errors.Is(err, lock.ErrUnavailable) || errors.Is(err, lock.ErrRefused)) {
		f.print(env.stdout, []lock.Finding{{Name: "connect", Status: lock.Fail, Detail: err.Error(),
			Fix: "make the backend reachable, with credentials and rights that may take a lock, then check again"}})
	}
	return err
}

// print writes the findings, and says whether one failed.
func (f *checkFlags) print(w io.Writer, findings []lock.Finding) bool {
	failed := false
	for _, x := range findings {
		failed = failed || x.Status == lock.Fail
	}
	if f.json {
		type check struct {
			Name   string      `json:"name"`
			Status lock.Status `json:"status"`
			Detail string      `json:"detail"`
			Fix    string      `json:"fix"`
		}
		out := struct {
			Backend string  `json:"backend"`
			URL     string  `json:"url"`
			OK      bool    `json:"ok"`
			Checks  []check `json:"checks"`
		}{Backend: backendName(f.db), URL: lock.Redact(f.db), OK: !failed, Checks: []check{}}
		for _, x := range findings {
			out.Checks = append(out.Checks, check(x))
		}
		b, _ := json.Marshal(out)
		fmt.Fprintf(w, "%s\n", b)
		return failed
	}
	for _, x := range findings {
		line := fmt.Sprintf("%-4s  %s: %s", x.Status, x.Name, x.Detail)
		if x.Fix != "" {
			line += "; " + x.Fix
		}
		fmt.Fprintln(w, line)
	}
	return failed
}
