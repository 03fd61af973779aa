// Package cmd is withlock's command line: flags, subcommands, and the one
// table that turns outcomes into exit codes.
package cmd

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

// Main runs withlock with os.Args and returns the exit status. It serves
// both main.go and the tests.
func Main() int {
	catchStopsAsPID1()
	return run(os.Args[1:], os.Stdout, os.Stderr)
}

func run(args []string, stdout, stderr io.Writer) int {
	env := &environment{stdout: stdout, stderr: &redactor{w: stderr}, logFormat: logFormatArg(args), conflictCode: exitNotAcquired}
	if f, ok := stderr.(*os.File); ok {
		env.terminal = terminalWidth(f)
	}
	root := newRootCmd(env)
	root.SetArgs(args)
	c, err := root.ExecuteC()
	if err == nil {
		return env.status
	}
	code := exitCode(err, env.conflictCode)
	if code == exitUsage {
		// The help of the command that complained: withlock status
		// --help for a mistake in a status command line.
		path := "withlock"
		if c != nil {
			path = c.CommandPath()
		}
		err = fmt.Errorf("%w (see %s --help)", err, path)
	}
	var said reported
	if !errors.As(err, &said) && (!quiet(err, code) || env.verbose) {
		env.logger().Error(err.Error())
	}
	return code
}

// environment is what one invocation shares between its commands: where
// output goes, how it is logged, and the status to exit with.
type environment struct {
	stdout       io.Writer
	stderr       *redactor
	logFormat    string
	verbose      bool
	conflictCode int
	status       int
	terminal     int // the width of the terminal stderr is, 0 when it is none
}

func (e *environment) logger() *slog.Logger {
	return newLogger(e.stderr, e.logFormat, e.verbose)
}

// logFormatArg finds --log-format among args before cobra parses them, so
// that even a complaint about another flag comes out in the chosen format.
func logFormatArg(args []string) string {
	for i, a := range args {
		switch {
		case a == "--":
			return "text"
		case a == "--log-format" && i+1 < len(args):
			return args[i+1]
		case strings.HasPrefix(a, "--log-format="):
			return strings.TrimPrefix(a, "--log-format=")
		}
	}
	return "text"
}

// Command returns withlock's command tree for tools that describe it: the
// release's man pages and shell completions (internal/release/docs). Its
// output goes nowhere; running withlock is Main's job, not this tree's.
func Command() *cobra.Command {
	return newRootCmd(&environment{stdout: io.Discard, stderr: &redactor{w: io.Discard}, logFormat: "text", conflictCode: exitNotAcquired})
}

func newRootCmd(env *environment) *cobra.Command {
	root := newRunCmd(env, "withlock [flags] NAME -- COMMAND [ARG...]")
	// --version is ours, not cobra's: cobra prints a custom version text
	// through text/template, and a program that links text/template keeps
	// every exported method of every type it uses (the template may call
	// any of them by name): that was 9 MB of the binary, go-redis's commands
	// the largest part, and milliseconds of page faults in every start.
	showVersion := root.Flags().Bool("version", false, "print the version")
	run := root.RunE
	root.RunE = func(c *cobra.Command, args []string) error {
		if *showVersion {
			_, err := io.WriteString(env.stdout, readBuildInfo().text())
			return err
		}
		return run(c, args)
	}
	root.AddCommand(
		newRunCmd(env, "run [flags] NAME -- COMMAND [ARG...]"),
		newAcquireCmd(env),
		newRenewCmd(env),
		newStatusCmd(env),
		newReleaseCmd(env),
		newKeeperCmd(env),
		newCheckCmd(env),
		newVersionCmd(env),
	)
	// cobra's completion command shows its help for a shell it does not
	// know, and exits 0; a script that asked for one must hear it failed.
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Args = cobra.ArbitraryArgs
			c.RunE = func(c *cobra.Command, args []string) error {
				if len(args) > 0 {
					return usagef("unknown shell %q: withlock completion takes bash, fish, powershell or zsh", args[0])
				}
				return c.Help()
			}
		}
	}
	root.SetHelpCommand(newHelpCmd(env))
	root.SetHelpFunc(printHelp)
	// cobra adds -h to a command only when it runs it, after it has found
	// the command among the arguments: until then it takes -h for a flag
	// with a value, and withlock -h status for the root's -h=status.
	root.InitDefaultHelpFlag()
	for _, c := range root.Commands() {
		c.InitDefaultHelpFlag()
	}
	root.SetOut(env.stdout)
	root.SetErr(env.stderr)
	return root
}

// noArgs is cobra.NoArgs in withlock's words, for the command named cmd.
func noArgs(cmd string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) > 0 {
			return usagef("%s takes no arguments, not %q", cmd, args)
		}
		return nil
	}
}
