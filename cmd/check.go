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
and releases a probe lock on a name of its own (withlock-check-<random>),
through the same code that taking a lock uses, and runs every check that
applies to the backend. It prints one line per check on stdout: ok, warn or
fail, what it found, and what to do about it.

A failed check is a trap that makes a lock exclude nobody: a PostgreSQL hot
standby, a pooler that shares sessions between clients, a read-only MySQL
replica, a Redis replica, a file:// directory on a network file system.
A warning is a condition that weakens a lock (a restart or eviction can
forget it) or a fact the server would not show. It leaves nothing behind.

Exit status: 0 when no check failed (warnings allowed); 78 when one failed;
69 when the backend cannot be reached or refuses the credentials; 64 usage.`,
		Example: `  withlock check --db postgres://ops@db.internal/app
  withlock check --json --db redis://cache.internal | jq '.checks[] | select(.status != "ok")'`,
		Args:          cobra.NoArgs,
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(c *cobra.Command, args []string) error {
			f.setEnv(env)
			if err := f.check(); err != nil {
				return err
			}
			client, err := f.openWith(env, lock.Options{SharedFS: f.sharedFS})
			if err != nil {
				return err
			}
			defer client.Close()
			ctx, cancel := context.WithTimeout(context.Background(), f.connectTimeout)
			defer cancel()
			findings, err := client.Check(ctx)
			if err != nil {
				return err
			}
			failed := f.print(env.stdout, findings)
			if failed {
				return reported{errCheckFailed}
			}
			return nil
		},
	}
	f.connFlags.register(c.Flags())
	c.Flags().BoolVar(&f.json, "json", false, "print one JSON object")
	c.Flags().BoolVar(&f.sharedFS, "fs-shares-locks", false, "file://: the directory's network file system shares its locks between every host that uses it (a warning, not a failure)")
	return c
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
