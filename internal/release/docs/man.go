package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/cpuguy83/go-md2man/v2/md2man"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/withlock/withlock/cmd"
)

// manHeader is what every page's title line carries beside its name.
type manHeader struct {
	date           time.Time
	source, manual string
}

// manPage is c's man page in roff, its sections in man-pages(7)'s order:
// NAME, SYNOPSIS, DESCRIPTION, OPTIONS, then the sections of c's
// reference (its Long text's headings: BACKENDS, ENVIRONMENT, EXIT
// STATUS, FILES...), EXAMPLES and SEE ALSO. It is written as Markdown
// and rendered by go-md2man, as cobra's own pages are.
func manPage(c *cobra.Command, h *manHeader) []byte {
	name := strings.ReplaceAll(c.CommandPath(), " ", "-")
	description, sections := cmd.Reference(c.Long)
	var b strings.Builder
	fmt.Fprintf(&b, "%% %q %q %q %q %q\n", strings.ToUpper(name), "1", h.date.Format("Jan 2006"), h.source, h.manual)
	fmt.Fprintf(&b, "# NAME\n%s \\- %s\n\n", name, c.Short)
	fmt.Fprintf(&b, "# SYNOPSIS\n**%s**\n\n", c.UseLine())
	fmt.Fprintf(&b, "# DESCRIPTION\n%s\n\n", description)
	c.InitDefaultHelpFlag()
	b.WriteString("# OPTIONS\n")
	for _, g := range cmd.FlagGroups(c.Flags()) {
		for _, f := range g.Flags {
			b.WriteString(manFlag(f))
		}
	}
	for _, s := range sections {
		fmt.Fprintf(&b, "# %s\n%s\n\n", s.Title, s.Text)
	}
	if c.Example != "" {
		fmt.Fprintf(&b, "# EXAMPLES\n```\n%s\n```\n\n", c.Example)
	}
	fmt.Fprintf(&b, "# SEE ALSO\n%s\n\nThe documentation, one page per backend: https://github.com/withlock/withlock/tree/main/docs\n", strings.Join(seeAlso(c), ", "))
	return md2man.Render([]byte(b.String()))
}

// manFlag is f as a term and its definition: "-n, --no-wait" or "--db
// URL", then its usage, default and detail.
func manFlag(f *pflag.Flag) string {
	term := "**--" + f.Name + "**"
	if f.Shorthand != "" {
		term = "**-" + f.Shorthand + "**, " + term
	}
	if v := cmd.ValueName(f); v != "" {
		term += " *" + v + "*"
	}
	text := cmd.FlagDetail(f)
	if text == "" {
		text = strings.ToUpper(f.Usage[:1]) + f.Usage[1:] + "."
	}
	if d := cmd.DefaultText(f); d != "" {
		text += " The default is " + d + "."
	}
	return term + "\n: " + text + "\n\n"
}

// seeAlso names the pages of c's parent and subcommands, and the tools
// whose locks withlock's are.
func seeAlso(c *cobra.Command) []string {
	var pages []string
	if c.HasParent() {
		pages = append(pages, "**"+strings.ReplaceAll(c.Parent().CommandPath(), " ", "-")+"**(1)")
	}
	for _, sub := range c.Commands() {
		if sub.IsAvailableCommand() && !sub.IsAdditionalHelpTopicCommand() && sub.Name() != "help" {
			pages = append(pages, "**"+strings.ReplaceAll(sub.CommandPath(), " ", "-")+"**(1)")
		}
	}
	return append(pages, "**flock**(1)", "**etcdctl**(1)")
}
