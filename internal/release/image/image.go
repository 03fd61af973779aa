package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's one layer holds only these, so that it runs as a non-root
// user with nothing else to attack or update.
const (
	binPath   = "/usr/bin/withlock"
	certsPath = "/etc/ssl/certs/ca-certificates.crt" // where Go looks first on Linux
	// nonroot is distroless's uid and gid; numeric in the config so that
	// Kubernetes' runAsNonRoot can check it without reading /etc/passwd.
	nonroot = "65532"
)

// license is the SPDX identifier of the LICENSE at the repository's root,
// which the archives and packages carry too (.goreleaser.yaml).
const license = "Apache-2.0"

// spec is what one image index is built from.
type spec struct {
	Version  string    // the release's version, the tag in the archive
	Revision string    // the git commit
	Created  time.Time // the commit's time: the same commit builds the same bytes
	Source   string    // the repository's URL
	// Binaries maps a platform ("linux/amd64") to a static withlock
	// binary built for it.
	Binaries map[string]string
	// Certs is a PEM bundle of CA certificates for TLS to the backends
	// (rediss://, postgres with sslmode=verify-full, mongodb+srv://).
	Certs []byte
}

// labels are the image's OCI labels (also its index's annotations).
func (s spec) labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "withlock",
		"org.opencontainers.image.description": "Run one command under a named lock held in a shared database",
		"org.opencontainers.image.source":      s.Source,
		"org.opencontainers.image.url":         s.Source,
		"org.opencontainers.image.version":     s.Version,
		"org.opencontainers.image.revision":    s.Revision,
		"org.opencontainers.image.created":     s.Created.UTC().Format(time.RFC3339),
		"org.opencontainers.image.licenses":    license,
	}
}

// build writes an OCI image archive to out: a tar of an OCI image layout
// whose index.json names one multi-platform image index, tagged
// s.Version ("org.opencontainers.image.ref.name"), with an image per
// platform in s.Binaries. `skopeo copy --all oci-archive:FILE
// docker://REGISTRY/withlock:TAG` pushes it as it is; `docker load` and
// `podman load` take it too.
func build(s spec, out string) error {
	platforms := make([]string, 0, len(s.Binaries))
	for p := range s.Binaries {
		platforms = append(platforms, p)
	}
	sort.Strings(platforms)
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	idx = mutate.Annotations(idx, s.labels()).(v1.ImageIndex)
	for _, p := range platforms {
		img, err := platformImage(s, p)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		goos, goarch, _ := strings.Cut(p, "/")
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: goos, Architecture: goarch}},
		})
	}

	dir, err := os.MkdirTemp("", "withlock-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": s.Version,
	})); err != nil {
		return err
	}
	return tarDir(dir, out, s.Created)
}

// platformImage is the image for one platform: FROM scratch, one layer.
func platformImage(s spec, platform string) (v1.Image, error) {
	bin, err := os.ReadFile(s.Binaries[platform])
	if err != nil {
		return nil, err
	}
	layer, err := rootfs(s, bin)
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: s.Created}, CreatedBy: "withlock internal/release/image", Comment: "withlock " + s.Version},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, _ = strings.Cut(platform, "/")
	cf.Created = v1.Time{Time: s.Created}
	cf.Config = v1.Config{
		Entrypoint: []string{binPath},
		User:       nonroot + ":" + nonroot,
		WorkingDir: "/",
		Env:        []string{"PATH=/usr/bin"},
		Labels:     s.labels(),
	}
	return mutate.ConfigFile(img, cf)
}

// rootfs is the layer: the binary, the CA bundle, and /etc/passwd and
// /etc/group naming the non-root user, all owned by root so that the
// user cannot change them.
func rootfs(s spec, bin []byte) (v1.Layer, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: s.Created, Format: tar.FormatPAX})
	}
	file := func(name string, mode int64, data []byte) error {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: s.Created, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	passwd := "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:" + nonroot + ":" + nonroot + ":nonroot:/home/nonroot:/sbin/nologin\n"
	group := "root:x:0:\nnonroot:x:" + nonroot + ":\n"
	for _, step := range []func() error{
		func() error { return dir("etc/") },
		func() error { return file("etc/group", 0o644, []byte(group)) },
		func() error { return file("etc/passwd", 0o644, []byte(passwd)) },
		func() error { return dir("etc/ssl/") },
		func() error { return dir("etc/ssl/certs/") },
		func() error { return file(strings.TrimPrefix(certsPath, "/"), 0o644, s.Certs) },
		func() error { return dir("usr/") },
		func() error { return dir("usr/bin/") },
		func() error { return file(strings.TrimPrefix(binPath, "/"), 0o755, bin) },
		tw.Close,
	} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	data := b.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching) // gzip once, not per digest, size and write
}

// tarDir writes the files under dir to a tar at out, in name order, with
// every time set to mtime and no owner names, so that the same input gives
// the same bytes.
func tarDir(dir, out string, mtime time.Time) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: mtime, Mode: 0o644, Format: tar.FormatPAX}
		if d.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
			return tw.WriteHeader(h)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(out)
	}
	return err
}
