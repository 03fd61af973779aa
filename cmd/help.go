package cmd

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// A command's help reads like gh's or kubectl's: the usage line first, a
// short description, examples, the flags in groups with named values, the
// subcommands, and where to read more. Its Long text is the man page's
// DESCRIPTION and reference: the first paragraph is the short description
// --help shows; each later line of capitals alone (EXIT STATUS) heads a
// section of the reference, which --help leaves to the man page and to
// withlock help.

// flagGroups are the groups --help lists flags in, in this order; a flag
// not in flagInfo goes last, under "Flags".
var flagGroups = []string{"Lock", "Waiting", "Connection", "Output"}

// flagInfo is each flag's group and the name of its value in help: --db
// URL, not --db string. The names are the same flag on every command.
var flagInfo = map[string]struct{ group, value string }{
	"ttl":                {"Lock", "D"},
	"shared":             {"Lock", ""},
	"max-holders":        {"Lock", "N"},
	"hold-at-least":      {"Lock", "D"},
	"kill-after":         {"Lock", "D"},
	"on-lost":            {"Lock", "stop|ignore"},
	"force":              {"Lock", ""},
	"fs-shares-locks":    {"Lock", ""},
	"max-hold":           {"Lock", "D"},
	"until-pid":          {"Lock", "PID"},
	"handle":             {"Lock", "H"},
	"handle-file":        {"Lock", "F"},
	"detach":             {"Lock", "keeper|lease"},
	"no-wait":            {"Waiting", ""},
	"timeout":            {"Waiting", "D"},
	"conflict-exit-code": {"Waiting", "N"},
	"db":                 {"Connection", "URL"},
	"connect-timeout":    {"Connection", "D"},
	"verbose":            {"Output", ""},
	"log-format":         {"Output", "text|json"},
	"json":               {"Output", ""},
	"help":               {"Output", ""},
	"version":            {"Output", ""},
}

// runFlagDetail is what the man page says of run's flags beyond their
// usage lines (describeFlags).
var runFlagDetail = map[string]string{
	"ttl":                "The lease length, at least 500ms. The lock is renewed (a lease) or checked (a session) every ttl/3; when no renewal succeeds for ttl minus --kill-after, COMMAND is stopped. Every user of NAME must give the same --ttl.",
	"kill-after":         "When the lock is lost, COMMAND's process group gets TERM, then KILL this long after. The default is 5s, or ttl/3 when that is shorter; it must be shorter than --ttl.",
	"on-lost":            "stop sends TERM, then KILL after --kill-after, and exits 70; ignore only warns, and lets COMMAND finish without the lock.",
	"hold-at-least":      "NAME stays held until this long after it was acquired, even when COMMAND ends sooner: a cron slot run once however quickly the job ends.",
	"shared":             "Any number of shared holders at once; an exclusive holder waits for them all, and new shared holders wait for it. Not on MySQL, Kubernetes or S3.",
	"max-holders":        "NAME becomes a semaphore: at most N holders at once. Every holder of NAME must give the same N.",
	"no-wait":            "One attempt: if NAME is held, withlock names its holder and exits 75 (see --conflict-exit-code).",
	"timeout":            "Give up after waiting this long, naming the holder, and exit 75. 0 makes one attempt, as --no-wait and flock -w 0. Without it, withlock waits as long as it takes.",
	"conflict-exit-code": "The exit status when NAME is not acquired (--no-wait, --timeout): 0 makes a cron entry on several hosts quiet.",
	"connect-timeout":    "How long an unreachable backend is retried before withlock gives up with 69.",
	"verbose":            "Say what withlock does and how long each step takes, on stderr, and who holds NAME while it waits (every 30s).",
	"max-hold":           "The keeper releases NAME this long after acquiring it, if no step has released it before: a pipeline that fails half-way does not hold NAME for ever. Required.",
	"until-pid":          "The keeper releases NAME when this process ends, checked every 250ms: a shell script gives $$, so that NAME is freed however the script ends.",
}

// connFlagDetail is the same for the flags of every command that talks to
// a backend.
var connFlagDetail = map[string]string{
	"db": "The backend URL (see BACKENDS in withlock(1)). Without it, $WITHLOCK_DB, else $PG_CONNECTION_STRING. A password in it never appears in any output; percent-encode its /, # and ?.",
}

// detailKey is the pflag annotation that holds a flag's detail.
const detailKey = "withlock_detail"

// describeFlags gives fs's flags the man page's text of them in details.
func describeFlags(fs *pflag.FlagSet, details map[string]string) {
	for name, d := range details {
		fs.SetAnnotation(name, detailKey, []string{d})
	}
}

// FlagDetail is what the man page says of f beyond its usage line, ""
// when nothing.
func FlagDetail(f *pflag.Flag) string {
	if d := f.Annotations[detailKey]; len(d) > 0 {
		return d[0]
	}
	return ""
}

// ValueName is the name help gives f's value ("URL", "D"), "" for a flag
// that takes none.
func ValueName(f *pflag.Flag) string {
	if info, ok := flagInfo[f.Name]; ok {
		return info.value
	}
	if f.Value.Type() == "bool" {
		return ""
	}
	return strings.ToUpper(f.Value.Type())
}

// DefaultText is f's default as help shows it, "" when there is none to
// show: a zero value means "not given", and a default that depends on
// other flags is said in the usage text.
func DefaultText(f *pflag.Flag) string {
	switch f.DefValue {
	case "", "0", "0s", "false", "[]":
		return ""
	}
	if strings.Contains(f.Usage, "(default") {
		return ""
	}
	return f.DefValue
}

// Description is the short description in long: its first paragraph.
func Description(long string) string {
	desc, _, _ := strings.Cut(long, "\n\n")
	return desc
}

// Section is one part of a command's reference: a heading of capitals
// (EXIT STATUS) and its text.
type Section struct {
	Title, Text string
}

// Topic is the name withlock help knows the section by: "exit-status".
func (s Section) Topic() string {
	return strings.ToLower(strings.ReplaceAll(s.Title, " ", "-"))
}

// Reference splits long into its description (everything before the first
// heading) and its sections.
func Reference(long string) (description string, sections []Section) {
	lines := strings.Split(long, "\n")
	var desc []string
	var cur *Section
	var text []string
	flush := func() {
		if cur != nil {
			cur.Text = strings.Trim(strings.Join(text, "\n"), "\n")
			sections = append(sections, *cur)
		}
	}
	for _, l := range lines {
		switch {
		case IsHeading(l):
			flush()
			cur, text = &Section{Title: l}, nil
		case cur == nil:
			desc = append(desc, l)
		default:
			text = append(text, l)
		}
	}
	flush()
	return strings.Trim(strings.Join(desc, "\n"), "\n"), sections
}

// IsHeading reports whether line heads a section: capitals and spaces
// alone.
func IsHeading(line string) bool {
	if len(line) < 2 || line[0] < 'A' || line[0] > 'Z' {
		return false
	}
	for _, r := range line {
		if (r < 'A' || r > 'Z') && r != ' ' {
			return false
		}
	}
	return true
}

// printHelp is every command's --help.
func printHelp(c *cobra.Command, _ []string) {
	w := c.OutOrStdout()
	fmt.Fprintf(w, "Usage:\n  %s\n", c.UseLine())
	if c.HasAvailableSubCommands() {
		fmt.Fprintf(w, "  %s COMMAND [flags]\n", c.CommandPath())
	}
	desc := Description(c.Long)
	if desc == "" {
		desc = c.Short
	}
	fmt.Fprintf(w, "\n%s\n", desc)
	if c.Example != "" {
		fmt.Fprintf(w, "\nExamples:\n%s\n", c.Example)
	}
	printFlags(w, c.Flags())
	if c.HasAvailableSubCommands() {
		fmt.Fprintln(w, "\nCommands:")
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() && sub.Name() != "run" {
				fmt.Fprintf(w, "  %-11s %s\n", sub.Name(), sub.Short)
			}
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, moreHelp(c))
}

// moreHelp is the last line of c's help: where its reference is.
func moreHelp(c *cobra.Command) string {
	if c == c.Root() || c.Name() == "run" {
		return fmt.Sprintf("More: withlock help COMMAND|%s; man withlock;\n%s", strings.Join(topics(), "|"), docsURL)
	}
	if _, sections := Reference(c.Long); len(sections) > 0 {
		var titles []string
		for _, s := range sections {
			titles = append(titles, strings.ToLower(s.Title))
		}
		return fmt.Sprintf("More (%s): withlock help %s, or man %s", strings.Join(titles, ", "), c.Name(), strings.ReplaceAll(c.CommandPath(), " ", "-"))
	}
	return fmt.Sprintf("More: man %s", strings.ReplaceAll(c.CommandPath(), " ", "-"))
}

const docsURL = "https://github.com/withlock/withlock/tree/main/docs"

// FlagGroup is a heading of --help ("Lock flags") and its flags.
type FlagGroup struct {
	Name  string
	Flags []*pflag.Flag
}

// FlagGroups is fs's flags by group, in the order they were defined (the
// most used first), hidden ones left out.
func FlagGroups(fs *pflag.FlagSet) []FlagGroup {
	sorted := fs.SortFlags
	fs.SortFlags = false
	defer func() { fs.SortFlags = sorted }()
	byName := map[string][]*pflag.Flag{}
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		g := "Flags"
		if info, ok := flagInfo[f.Name]; ok {
			g = info.group + " flags"
		}
		byName[g] = append(byName[g], f)
	})
	var groups []FlagGroup
	for _, g := range flagGroups {
		if fl := byName[g+" flags"]; len(fl) > 0 {
			groups = append(groups, FlagGroup{g + " flags", fl})
		}
	}
	if fl := byName["Flags"]; len(fl) > 0 {
		groups = append(groups, FlagGroup{"Flags", fl})
	}
	return groups
}

// printFlags lists fs's flags by group, each with its value's name, its
// default where it has one to show, and its usage. -h is left out: every
// help says how it was asked for.
func printFlags(w io.Writer, fs *pflag.FlagSet) {
	groups := FlagGroups(fs)
	width := 0
	for _, g := range groups {
		for _, f := range g.Flags {
			width = max(width, len(flagName(f)))
		}
	}
	fmt.Fprintln(w)
	for _, g := range groups {
		fmt.Fprintf(w, "%s:\n", g.Name)
		for _, f := range g.Flags {
			if f.Name == "help" {
				continue
			}
			usage := f.Usage
			if d := DefaultText(f); d != "" {
				usage += " (default " + d + ")"
			}
			fmt.Fprintf(w, "  %-*s  %s\n", width, flagName(f), usage)
		}
	}
}

// flagName is "-n, --no-wait" or "    --db URL".
func flagName(f *pflag.Flag) string {
	s := "    --" + f.Name
	if f.Shorthand != "" {
		s = "-" + f.Shorthand + ", --" + f.Name
	}
	if v := ValueName(f); v != "" {
		s += " " + v
	}
	return s
}

// newHelpCmd is withlock help: a command's help with its whole reference
// (withlock help status), or one section of withlock's own (withlock help
// exit-status).
func newHelpCmd(env *environment) *cobra.Command {
	return &cobra.Command{
		Use:   "help [COMMAND|TOPIC]",
		Short: "Help about a command, or a topic: " + strings.Join(topics(), ", "),
		Long: `help shows a command's help and its whole reference (output, rights, exit
status), or one topic of withlock's reference.`,
		Args:              cobra.MaximumNArgs(1),
		SilenceErrors:     true,
		SilenceUsage:      true,
		ValidArgsFunction: completeHelp,
		RunE: func(c *cobra.Command, args []string) error {
			root := c.Root()
			if len(args) == 0 {
				printHelp(root, nil)
				return nil
			}
			w := c.OutOrStdout()
			if sub, _, err := root.Find(args); err == nil && sub != root {
				printHelp(sub, nil)
				if _, sections := Reference(sub.Long); len(sections) > 0 {
					printSections(w, sections)
				}
				return nil
			}
			_, sections := Reference(root.Long)
			for _, s := range sections {
				if args[0] == s.Topic() || args[0] == strings.SplitN(s.Topic(), "-", 2)[0] {
					printSections(w, []Section{s})
					return nil
				}
			}
			return usagef("no help for %q: withlock help takes a command (%s) or a topic (%s)", args[0], strings.Join(commandNames(root), ", "), strings.Join(topics(), ", "))
		},
	}
}

func printSections(w io.Writer, sections []Section) {
	for _, s := range sections {
		fmt.Fprintf(w, "\n%s\n\n%s\n", s.Title, s.Text)
	}
}

// topics are the names of the sections of withlock's reference.
func topics() []string {
	_, sections := Reference(runLong)
	var t []string
	for _, s := range sections {
		t = append(t, s.Topic())
	}
	return t
}

func commandNames(root *cobra.Command) []string {
	var names []string
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	return names
}

func completeHelp(c *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return append(commandNames(c.Root()), topics()...), cobra.ShellCompDirectiveNoFileComp
}
