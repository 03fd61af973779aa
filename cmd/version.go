package cmd

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// Stamped at build time by make build and goreleaser, for example
//
//	-ldflags "-X github.com/withlock/withlock/cmd.version=1.2.3
//	          -X github.com/withlock/withlock/cmd.commit=0123abc...
//	          -X github.com/withlock/withlock/cmd.date=2026-01-02T03:04:05Z"
//
// A build without them (go install, go build) falls back to what the Go
// toolchain recorded in the binary; see readBuildInfo.
var version, commit, date string

// buildInfo is what withlock version reports. Empty fields are unknown.
type buildInfo struct {
	Version   string
	Commit    string
	Date      string
	GoVersion string
	Platform  string // GOOS/GOARCH
}

// readBuildInfo is this binary's buildInfo.
func readBuildInfo() buildInfo {
	bi, _ := debug.ReadBuildInfo()
	return resolveBuildInfo(buildInfo{Version: version, Commit: commit, Date: date}, bi)
}

// resolveBuildInfo fills what the linker flags left unset from bi (nil if
// the binary has none): "go install module@v1.2.3" records the module's
// version, and a build inside a git checkout records the revision and its
// time (unless -buildvcs=false). A version nobody stamped or recorded is
// "dev". A leading "v" is dropped, so that "go install ...@v1.2.3" and the
// release archives, packages and image of 1.2.3 all print "1.2.3".
func resolveBuildInfo(stamped buildInfo, bi *debug.BuildInfo) buildInfo {
	info := stamped
	info.GoVersion = runtime.Version()
	info.Platform = runtime.GOOS + "/" + runtime.GOARCH
	if bi != nil {
		if info.Version == "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && info.Commit == "":
				info.Commit = s.Value
			case s.Key == "vcs.time" && info.Date == "":
				info.Date = s.Value
			}
		}
		if bi.GoVersion != "" {
			info.GoVersion = bi.GoVersion
		}
	}
	if len(info.Version) > 1 && info.Version[0] == 'v' && '0' <= info.Version[1] && info.Version[1] <= '9' {
		info.Version = info.Version[1:]
	}
	if info.Version == "" {
		info.Version = "dev"
	}
	return info
}

// text is withlock version's output (and --version's).
func (info buildInfo) text() string {
	unknown := func(s string) string {
		if s == "" {
			return "unknown"
		}
		return s
	}
	var b strings.Builder
	fmt.Fprintf(&b, "withlock %s\n", info.Version)
	fmt.Fprintf(&b, "commit:  %s\n", unknown(info.Commit))
	fmt.Fprintf(&b, "built:   %s\n", unknown(info.Date))
	fmt.Fprintf(&b, "go:      %s %s\n", info.GoVersion, info.Platform)
	return b.String()
}

// versionObject is withlock version --json's object; null where unknown.
type versionObject struct {
	Version   string  `json:"version"`
	Commit    *string `json:"commit"`
	BuildDate *string `json:"build_date"`
	GoVersion string  `json:"go_version"`
	Platform  string  `json:"platform"`
}

func (info buildInfo) object() versionObject {
	orNull := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	return versionObject{
		Version:   info.Version,
		Commit:    orNull(info.Commit),
		BuildDate: orNull(info.Date),
		GoVersion: info.GoVersion,
		Platform:  info.Platform,
	}
}

func newVersionCmd(env *environment) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "version [--json]",
		Short: "Print withlock's version, commit, build date and Go version",
		Long: `version prints withlock's version, the commit it was built from, the
build date (the commit's date, so that a commit builds the same bytes), and
the Go version and platform it was built with. A build without these stamps
(go install) says what Go recorded, else dev and unknown. withlock --version
prints the same.

OUTPUT

Four lines on stdout; with --json one object with the keys version, commit,
build_date, go_version and platform (null where unknown).

EXIT STATUS

- 0: always, unless stdout cannot be written.`,
		Example: `  withlock version
  withlock version --json | jq -r .version`,
		Args: noArgs("version"),
		RunE: func(*cobra.Command, []string) error {
			info := readBuildInfo()
			if !asJSON {
				_, err := fmt.Fprint(env.stdout, info.text())
				return err
			}
			b, err := json.Marshal(info.object())
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(env.stdout, "%s\n", b)
			return err
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print one JSON object: version, commit, build_date, go_version, platform")
	return c
}
