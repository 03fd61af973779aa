// Package dist checks the release configuration against the repository:
// the license that every archive, package and image carries.
package dist

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// root is the repository's root, seen from this package's directory.
var root = filepath.Join("..", "..", "..")

// spdx is the license the packages declare and the image labels: the one
// in LICENSE.
const spdx = "Apache-2.0"

// goreleaser is the part of .goreleaser.yaml these tests read.
type goreleaser struct {
	Archives []struct {
		ID    string `json:"id"`
		Files []struct {
			Src string `json:"src"`
			Dst string `json:"dst"`
		} `json:"files"`
	} `json:"archives"`
	NFPMs []struct {
		ID       string   `json:"id"`
		License  string   `json:"license"`
		Formats  []string `json:"formats"`
		Contents []struct {
			Src string `json:"src"`
			Dst string `json:"dst"`
		} `json:"contents"`
	} `json:"nfpms"`
}

func readConfig(t *testing.T) goreleaser {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, ".goreleaser.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c goreleaser
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf(".goreleaser.yaml: %v", err)
	}
	if len(c.Archives) == 0 || len(c.NFPMs) == 0 {
		t.Fatalf(".goreleaser.yaml: %d archives, %d nfpms; want both", len(c.Archives), len(c.NFPMs))
	}
	return c
}

// LICENSE at the root is the Apache License 2.0, whole.
func TestLicenseFile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "LICENSE"))
	if err != nil {
		t.Fatal("LICENSE at the repository's root:", err)
	}
	text := string(data)
	for _, want := range []string{
		"Apache License",
		"Version 2.0, January 2004",
		"TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
		"9. Accepting Warranty or Additional Liability.",
		"END OF TERMS AND CONDITIONS",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("LICENSE lacks %q: not the whole Apache License 2.0", want)
		}
	}
}

// Every archive holds LICENSE at its top, beside README.md.
func TestArchivesCarryLicense(t *testing.T) {
	for i, a := range readConfig(t).Archives {
		found := false
		for _, f := range a.Files {
			if f.Src == "LICENSE" && (f.Dst == "" || f.Dst == "LICENSE") {
				found = true
			}
		}
		if !found {
			t.Errorf("archives[%d] (%q): no files entry with src: LICENSE at the archive's top", i, a.ID)
		}
	}
}

// Every package declares the license and installs its text where the
// distributions keep a package's documents.
func TestPackagesDeclareLicense(t *testing.T) {
	for i, n := range readConfig(t).NFPMs {
		if n.License != spdx {
			t.Errorf("nfpms[%d] (%v): license %q; want %q", i, n.Formats, n.License, spdx)
		}
		found := false
		for _, c := range n.Contents {
			if c.Src == "LICENSE" && c.Dst == "/usr/share/doc/withlock/LICENSE" {
				found = true
			}
		}
		if !found {
			t.Errorf("nfpms[%d] (%v): no contents entry installing LICENSE as /usr/share/doc/withlock/LICENSE", i, n.Formats)
		}
	}
}
