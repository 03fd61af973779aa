package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	testVersion  = "1.2.3-test"
	testRevision = "0123456789abcdef0123456789abcdef01234567"
)

var testCreated = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// binaries are the withlock binaries built by TestMain, by GOARCH.
var binaries = map[string]string{}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "withlock-image-test-")
	if err != nil {
		panic(err)
	}
	for _, arch := range []string{"amd64", "arm64"} {
		if binaries[arch], err = buildWithlock(dir, arch); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// buildWithlock builds the product for linux/ARCH as the release does
// (static, stamped; see .goreleaser.yaml) into dir/ARCH/withlock.
func buildWithlock(dir, arch string) (string, error) {
	out := filepath.Join(dir, arch, "withlock")
	ldflags := fmt.Sprintf("-s -w -X github.com/withlock/withlock/cmd.version=%s -X github.com/withlock/withlock/cmd.commit=%s -X github.com/withlock/withlock/cmd.date=%s",
		testVersion, testRevision, testCreated.Format(time.RFC3339))
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", ldflags, "-o", out, ".")
	cmd.Dir = filepath.Join("..", "..", "..") // the product module
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build withlock for linux/%s: %v\n%s", arch, err, b)
	}
	return out, nil
}

func testSpec() spec {
	return spec{
		Version:  testVersion,
		Revision: testRevision,
		Created:  testCreated,
		Source:   "https://github.com/withlock/withlock",
		Binaries: map[string]string{"linux/amd64": binaries["amd64"], "linux/arm64": binaries["arm64"]},
		Certs:    []byte("-----BEGIN CERTIFICATE-----\ntest bundle\n-----END CERTIFICATE-----\n"),
	}
}

// The archive read back has one multi-platform index tagged with the
// version, and per platform an image whose config runs the binary as the
// non-root user with the OCI labels, over one layer holding exactly the
// binary built for that platform, the CA bundle and the user's entries.
func TestImage(t *testing.T) {
	s := testSpec()
	out := filepath.Join(t.TempDir(), "withlock_oci.tar")
	if err := build(s, out); err != nil {
		t.Fatal(err)
	}
	got, err := inspect(out)
	if err != nil {
		t.Fatal(err)
	}
	if got.Tag != testVersion || got.MediaType != types.OCIImageIndex {
		t.Errorf("index.json names %s tagged %q; want %s tagged %q", got.MediaType, got.Tag, types.OCIImageIndex, testVersion)
	}
	wantLabels := map[string]string{
		"org.opencontainers.image.title":       "withlock",
		"org.opencontainers.image.description": "Run one command under a named lock held in a shared database",
		"org.opencontainers.image.source":      "https://github.com/withlock/withlock",
		"org.opencontainers.image.url":         "https://github.com/withlock/withlock",
		"org.opencontainers.image.version":     testVersion,
		"org.opencontainers.image.revision":    testRevision,
		"org.opencontainers.image.created":     "2026-01-02T03:04:05Z",
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
	if !reflect.DeepEqual(got.Annotations, wantLabels) {
		t.Errorf("index annotations = %v; want %v", got.Annotations, wantLabels)
	}
	var platforms []string
	for _, img := range got.Images {
		platforms = append(platforms, img.Platform)
	}
	if want := []string{"linux/amd64", "linux/arm64"}; !slices.Equal(platforms, want) {
		t.Fatalf("platforms %q; want %q", platforms, want)
	}

	for _, img := range got.Images {
		t.Run(img.Platform, func(t *testing.T) {
			goos, goarch, _ := strings.Cut(img.Platform, "/")
			if img.MediaType != types.OCIManifestSchema1 || img.OS != goos || img.Arch != goarch {
				t.Errorf("manifest %s for %s/%s; want %s for %s", img.MediaType, img.OS, img.Arch, types.OCIManifestSchema1, img.Platform)
			}
			want := v1.Config{
				Entrypoint: []string{"/usr/bin/withlock"},
				User:       "65532:65532",
				WorkingDir: "/",
				Env:        []string{"PATH=/usr/bin"},
				Labels:     wantLabels,
			}
			if !reflect.DeepEqual(img.Config, want) {
				t.Errorf("config\n got %+v\nwant %+v", img.Config, want)
			}
			if len(img.Layers) != 1 || img.Layers[0].MediaType != types.OCILayer {
				t.Fatalf("layers %+v; want one %s", img.Layers, types.OCILayer)
			}
			var files []string
			for _, f := range img.Layers[0].Files {
				files = append(files, fmt.Sprintf("%s %s %d:%d", f.Mode, f.Name, f.UID, f.GID))
			}
			wantFiles := []string{
				"drwxr-xr-x etc/ 0:0",
				"-rw-r--r-- etc/group 0:0",
				"-rw-r--r-- etc/passwd 0:0",
				"drwxr-xr-x etc/ssl/ 0:0",
				"drwxr-xr-x etc/ssl/certs/ 0:0",
				"-rw-r--r-- etc/ssl/certs/ca-certificates.crt 0:0",
				"drwxr-xr-x usr/ 0:0",
				"drwxr-xr-x usr/bin/ 0:0",
				"-rwxr-xr-x usr/bin/withlock 0:0",
			}
			if !slices.Equal(files, wantFiles) {
				t.Errorf("layer files\n got %q\nwant %q", files, wantFiles)
			}

			content := layerContents(t, out, img.Digest)
			bin, err := os.ReadFile(s.Binaries[img.Platform])
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(content["usr/bin/withlock"], bin) {
				t.Errorf("usr/bin/withlock is not the binary built for %s", img.Platform)
			}
			if !bytes.Equal(content["etc/ssl/certs/ca-certificates.crt"], s.Certs) {
				t.Errorf("ca-certificates.crt = %q; want the bundle given", content["etc/ssl/certs/ca-certificates.crt"])
			}
			if !strings.Contains(string(content["etc/passwd"]), "nonroot:x:65532:65532:") {
				t.Errorf("etc/passwd = %q; want the nonroot user 65532", content["etc/passwd"])
			}
			checkStaticELF(t, content["usr/bin/withlock"], goarch)
			if goarch == runtime.GOARCH && runtime.GOOS == "linux" {
				checkRuns(t, content["usr/bin/withlock"])
			}
		})
	}
}

// The same input gives the same bytes: a release can be rebuilt and
// compared.
func TestImageReproducible(t *testing.T) {
	s := testSpec()
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	if err := build(s, a); err != nil {
		t.Fatal(err)
	}
	if err := build(s, b); err != nil {
		t.Fatal(err)
	}
	da, _ := os.ReadFile(a)
	db, _ := os.ReadFile(b)
	if len(da) == 0 || !bytes.Equal(da, db) {
		t.Errorf("two builds of the same spec differ (%d and %d bytes)", len(da), len(db))
	}
}

// "image dist" takes the linux binaries goreleaser listed, names the
// archive after the project and version, and adds its checksum to
// checksums.txt beside goreleaser's lines.
func TestDist(t *testing.T) {
	dist := t.TempDir()
	amd64, arm64 := binaries["amd64"], binaries["arm64"]
	writeJSON(t, filepath.Join(dist, "metadata.json"), map[string]string{"project_name": "withlock", "version": testVersion, "commit": testRevision})
	writeJSON(t, filepath.Join(dist, "artifacts.json"), []map[string]string{
		{"type": "Binary", "path": amd64, "goos": "linux", "goarch": "amd64"},
		{"type": "Binary", "path": arm64, "goos": "linux", "goarch": "arm64"},
		{"type": "Archive", "path": "dist/withlock_linux_amd64.tar.gz", "goos": "linux", "goarch": "amd64"},
	})
	goreleasers := "aaaa  withlock_1.2.3-test_linux_amd64.tar.gz\n"
	if err := os.WriteFile(filepath.Join(dist, "checksums.txt"), []byte(goreleasers), 0o644); err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(t.TempDir(), "certs.pem")
	if err := os.WriteFile(certs, []byte("bundle\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	for range 2 { // twice: the second run replaces its line
		if err := distCmd([]string{"-created", "2026-01-02T03:04:05Z", "-certs", certs, dist}); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dist, "withlock_1.2.3-test_oci.tar")
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	want := goreleasers + hex.EncodeToString(sum[:]) + "  withlock_1.2.3-test_oci.tar\n"
	if got, _ := os.ReadFile(filepath.Join(dist, "checksums.txt")); string(got) != want {
		t.Errorf("checksums.txt\n got %q\nwant %q", got, want)
	}
	s, err := inspect(out)
	if err != nil {
		t.Fatal(err)
	}
	if s.Tag != testVersion || len(s.Images) != 2 || s.Images[0].Config.Labels["org.opencontainers.image.revision"] != testRevision {
		t.Errorf("image: tag %q, %d images, labels %v; want %q, 2, revision %s", s.Tag, len(s.Images), s.Images[0].Config.Labels, testVersion, testRevision)
	}
}

// layerContents returns the files of the one layer of the image whose
// manifest digest is given, by name.
func layerContents(t *testing.T, archive, digest string) map[string][]byte {
	t.Helper()
	idx, _, cleanup, err := openArchive(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	h, err := v1.NewHash(digest)
	if err != nil {
		t.Fatal(err)
	}
	img, err := idx.Image(h)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files, err := readTar(layers[0])
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// checkStaticELF checks that bin is an ELF executable for goarch that
// needs no dynamic loader, which FROM scratch does not have.
func checkStaticELF(t *testing.T, bin []byte, goarch string) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("usr/bin/withlock: %v", err)
	}
	machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[goarch]
	if f.Machine != machine {
		t.Errorf("usr/bin/withlock is for %v; want %v", f.Machine, machine)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("usr/bin/withlock asks for a dynamic loader; the image has none")
		}
	}
}

// checkRuns runs the image's binary and checks that it is the stamped
// release build.
func checkRuns(t *testing.T, bin []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "withlock")
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(path, "version", "--json").Output()
	if err != nil {
		t.Fatalf("withlock version --json: %v", err)
	}
	var v struct{ Version, Commit string }
	if err := json.Unmarshal(out, &v); err != nil || v.Version != testVersion || v.Commit != testRevision {
		t.Errorf("withlock version --json = %s (%v); want version %s, commit %s", out, err, testVersion, testRevision)
	}
}

func writeJSON(t *testing.T, file string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func readTar(l v1.Layer) (map[string][]byte, error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return nil, err
		}
		if files[h.Name], err = io.ReadAll(tr); err != nil {
			return nil, err
		}
	}
}
