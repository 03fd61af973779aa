// Command image builds withlock's OCI image without a container engine,
// and reads one back:
//
//	go run ./image dist [-created RFC3339] [-source URL] DIST
//	go run ./image inspect FILE
//
// "dist" runs after goreleaser: it takes the linux binaries that
// goreleaser listed in DIST/artifacts.json and the version and commit in
// DIST/metadata.json, writes DIST/withlock_VERSION_oci.tar (a tar of an
// OCI image layout holding one multi-platform image), adds its line to
// DIST/checksums.txt, and prints the image as inspect reads it back.
//
// "inspect" prints, as JSON, the tag, the index, and each platform's
// manifest media type, config (entrypoint, user, labels) and layer files.
//
// Each image is FROM scratch: one layer with the static binary as
// /usr/bin/withlock (the entrypoint), the build host's CA bundle for TLS
// to the backends, and /etc/passwd naming uid 65532, which it runs as.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "dist":
		err = distCmd(os.Args[2:])
	case "inspect":
		if len(os.Args) != 3 {
			usage()
		}
		err = printInspect(os.Args[2])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: image dist [-created RFC3339] [-source URL] [-certs FILE] DIST\n       image inspect FILE")
	os.Exit(2)
}

func distCmd(args []string) error {
	fs := flag.NewFlagSet("dist", flag.ExitOnError)
	created := fs.String("created", "", "the image's creation time, RFC 3339 (make dist: the commit's time); default now")
	source := fs.String("source", "https://github.com/withlock/withlock", "org.opencontainers.image.source")
	certs := fs.String("certs", certsPath, "PEM bundle of CA certificates to put in the image")
	fs.Parse(args)
	if fs.NArg() != 1 {
		usage()
	}
	dist := fs.Arg(0)
	s := spec{Source: *source, Created: time.Now().UTC().Truncate(time.Second)}
	if *created != "" {
		t, err := time.Parse(time.RFC3339, *created)
		if err != nil {
			return fmt.Errorf("-created: %w", err)
		}
		s.Created = t
	}
	var err error
	if s.Certs, err = os.ReadFile(*certs); err != nil {
		return fmt.Errorf("the image needs CA certificates: %w (apt-get install ca-certificates)", err)
	}
	var meta struct {
		ProjectName string `json:"project_name"`
		Version     string `json:"version"`
		Commit      string `json:"commit"`
	}
	if err := readJSON(filepath.Join(dist, "metadata.json"), &meta); err != nil {
		return fmt.Errorf("%w (run goreleaser first: make dist)", err)
	}
	s.Version, s.Revision = meta.Version, meta.Commit
	if s.Binaries, err = linuxBinaries(dist); err != nil {
		return err
	}

	name := fmt.Sprintf("%s_%s_oci.tar", meta.ProjectName, meta.Version)
	out := filepath.Join(dist, name)
	if err := build(s, out); err != nil {
		return err
	}
	if err := addChecksum(filepath.Join(dist, "checksums.txt"), out); err != nil {
		return err
	}
	return printInspect(out)
}

// linuxBinaries reads goreleaser's DIST/artifacts.json for the linux
// binaries, by platform. Their paths there are relative to the project,
// DIST's parent.
func linuxBinaries(dist string) (map[string]string, error) {
	var artifacts []struct {
		Type   string `json:"type"`
		Path   string `json:"path"`
		Goos   string `json:"goos"`
		Goarch string `json:"goarch"`
	}
	if err := readJSON(filepath.Join(dist, "artifacts.json"), &artifacts); err != nil {
		return nil, err
	}
	bins := map[string]string{}
	for _, a := range artifacts {
		if a.Type == "Binary" && a.Goos == "linux" {
			if !filepath.IsAbs(a.Path) {
				a.Path = filepath.Join(dist, "..", a.Path)
			}
			bins["linux/"+a.Goarch] = a.Path
		}
	}
	if len(bins) == 0 {
		return nil, errors.New(filepath.Join(dist, "artifacts.json") + " lists no linux binary")
	}
	return bins, nil
}

// addChecksum adds file's line to checksums.txt (goreleaser's format:
// "SHA256  NAME"), replacing an older line for the same name.
func addChecksum(sums, file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(data)
	name := filepath.Base(file)
	old, err := os.ReadFile(sums)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(old)), "\n") {
		if l != "" && !strings.HasSuffix(l, "  "+name) {
			lines = append(lines, l)
		}
	}
	lines = append(lines, hex.EncodeToString(sum[:])+"  "+name)
	return os.WriteFile(sums, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

func printInspect(file string) error {
	s, err := inspect(file)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	fmt.Printf("%s\n", b)
	return nil
}

func readJSON(file string, v any) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	return nil
}
