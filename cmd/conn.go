package cmd

import (
	"context"
	"github.com/spf13/cobra"
	"io"
	"net/url"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/withlock/withlock/internal/lock"
)

// connFlags are the flags of every command that talks to a backend.
type connFlags struct {
	db             string
	connectTimeout time.Duration
	verbose        bool
	logFormat      string
}

func (f *connFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.db, "db", "", "backend URL (default $WITHLOCK_DB, else $PG_CONNECTION_STRING)")
	fs.DurationVar(&f.connectTimeout, "connect-timeout", lock.DefaultConnectTimeout, "retry an unreachable backend this long, then exit 69")
	fs.BoolVarP(&f.verbose, "verbose", "v", false, "say what withlock does and how long each step takes")
	fs.StringVar(&f.logFormat, "log-format", "text", "withlock's own messages on stderr: text or json")
	describeFlags(fs, connFlagDetail)
}

// completeFlags registers the completions of the connection flags of c:
// --db's schemes and --log-format's values.
func completeFlags(c *cobra.Command) {
	c.RegisterFlagCompletionFunc("db", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		var s []string
		for _, scheme := range lock.Schemes() {
			s = append(s, scheme+"://")
		}
		return s, cobra.ShellCompDirectiveNoSpace
	})
	c.RegisterFlagCompletionFunc("log-format", cobra.FixedCompletions([]string{"text", "json"}, cobra.ShellCompDirectiveNoFileComp))
}

// completeHeld completes a NAME argument with the names of the locks held
// on the backend the flags give (withlock status without NAME), asked
// with a short timeout; nothing when it cannot be reached.
func (f *connFlags) completeHeld(env *environment) cobra.CompletionFunc {
	return func(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		quiet := *env
		quiet.stderr = &redactor{w: io.Discard}
		f.connectTimeout = min(f.connectTimeout, 2*time.Second)
		client, err := f.openWith(&quiet, lock.Options{Log: quietLogger})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		defer client.Close()
		ctx, cancel := context.WithTimeout(context.Background(), f.connectTimeout)
		defer cancel()
		held, err := client.List(ctx)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var names []string
		for _, st := range held {
			if st.Name != "" {
				names = append(names, st.Name)
			}
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

// oneAttempt is the text of --connect-timeout for the operators' commands
// (status, release, check), which make one attempt: the timeout bounds it,
// and nothing is retried.
func oneAttempt(fs *pflag.FlagSet) {
	fs.Lookup("connect-timeout").Usage = "give up on the backend after D, then exit 69 (one attempt, no retries)"
}

// setEnv makes the invocation's output follow the flags.
func (f *connFlags) setEnv(env *environment) {
	env.verbose, env.logFormat = f.verbose, f.logFormat
}

// prepare makes the invocation's output follow the flags, then checks
// them. It may be called more than once.
func (f *connFlags) prepare(env *environment) error {
	f.setEnv(env)
	return f.check()
}

// open opens a Client for an operator's command: one attempt, bounded by
// --connect-timeout.
func (f *connFlags) open(env *environment) (*lock.Client, error) {
	return f.openWith(env, lock.Options{})
}

// openWith is open with more options.
func (f *connFlags) openWith(env *environment, opts lock.Options) (*lock.Client, error) {
	if err := f.prepare(env); err != nil {
		return nil, err
	}
	dbURL, err := f.backendURL(env)
	if err != nil {
		return nil, err
	}
	f.db = dbURL
	opts.ConnectTimeout = f.connectTimeout
	opts.Holder = lock.Holder{Host: lock.Hostname(), PID: os.Getpid()}
	opts.Log = env.logger()
	return lock.Open(dbURL, opts)
}

func (f *connFlags) check() error {
	switch {
	case f.logFormat != "text" && f.logFormat != "json":
		return usagef("--log-format is text or json, not %q", f.logFormat)
	case f.connectTimeout <= 0:
		return usagef("--connect-timeout must be positive")
	}
	return nil
}

// backendURL picks the URL: --db, else $WITHLOCK_DB, else
// $PG_CONNECTION_STRING (docs/behaviour.md, Choosing the backend), and hides its
// password in everything written from then on.
//
// With -v it says which backend that is and where its URL came from, its
// password hidden: $PG_CONNECTION_STRING may be the application's own.
func (f *connFlags) backendURL(env *environment) (string, error) {
	for _, src := range []struct{ from, url string }{
		{"--db", f.db},
		{"$WITHLOCK_DB", os.Getenv("WITHLOCK_DB")},
		{"$PG_CONNECTION_STRING", os.Getenv("PG_CONNECTION_STRING")},
	} {
		if u := src.url; u != "" {
			env.stderr.secrets = urlSecrets(u)
			if p, err := url.Parse(u); err == nil {
				env.logger().Debug("backend", "scheme", p.Scheme, "url", p.Redacted(), "from", src.from)
			}
			return u, nil
		}
	}
	return "", usagef("no backend: give --db URL, or set $WITHLOCK_DB or $PG_CONNECTION_STRING (for one host: --db file:///var/lock/withlock)")
}
