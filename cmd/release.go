package cmd

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// releaseFlags are the flags of withlock release.
type releaseFlags struct {
	connFlags
	force   bool
	timeout time.Duration
}

func newReleaseCmd(env *environment) *cobra.Command {
	f := &releaseFlags{}
	c := &cobra.Command{
		Use:   "release --force [flags] NAME",
		Short: "Break NAME's lock, whoever holds it",
		Long: `release --force breaks NAME's lock: PostgreSQL and MySQL terminate the
holder's session, lease backends delete the lease, the file backend signals
the local withlock that holds it. The holder sees the loss within ttl/3,
stops its command and exits 70.

Exit status: 0 when NAME is no longer held by those who held it (it says on
stderr whom it broke, or that nothing was held); 64 usage (including a
missing --force); 69 backend unavailable or the break not allowed; 75 the
lock could not be broken.`,
		Example: `  withlock status dbmigration            # see who holds it first
  withlock release --force dbmigration`,
		Args:          cobra.ExactArgs(1),
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(c *cobra.Command, args []string) error {
			f.setEnv(env)
			if err := f.check(); err != nil {
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
	c.Flags().BoolVar(&f.force, "force", false, "break the lock, whoever holds it (required)")
	c.Flags().DurationVar(&f.timeout, "timeout", 10*time.Second, "how long to wait for the holders to let go")
	return c
}
