package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// summary is what inspect reads back from an image archive: what a user
// of the image depends on, for make dist to print and the tests to check.
type summary struct {
	Tag         string            `json:"tag"` // the ref.name annotation in index.json
	MediaType   types.MediaType   `json:"media_type"`
	Annotations map[string]string `json:"annotations"`
	Images      []imageSummary    `json:"images"`
}

type imageSummary struct {
	Platform  string          `json:"platform"`
	MediaType types.MediaType `json:"media_type"`
	Digest    string          `json:"digest"`
	OS        string          `json:"os"`
	Arch      string          `json:"architecture"`
	Config    v1.Config       `json:"config"`
	Layers    []layerSummary  `json:"layers"`
}

type layerSummary struct {
	MediaType types.MediaType `json:"media_type"`
	Files     []fileSummary   `json:"files"`
}

type fileSummary struct {
	Name string `json:"name"`
	Mode string `json:"mode"` // like ls -l: "-rwxr-xr-x"
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
	Size int64  `json:"size"`
}

// openArchive unpacks an OCI image archive into a new directory and
// returns the image index that its index.json names, and a function that
// removes the directory.
func openArchive(file string) (v1.ImageIndex, string, func(), error) {
	dir, err := os.MkdirTemp("", "withlock-inspect-")
	if err != nil {
		return nil, "", nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	fail := func(err error) (v1.ImageIndex, string, func(), error) {
		cleanup()
		return nil, "", nil, fmt.Errorf("%s: %w", file, err)
	}
	if err := untar(file, dir); err != nil {
		return fail(err)
	}
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return fail(err)
	}
	im, err := top.IndexManifest()
	if err != nil {
		return fail(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].MediaType != types.OCIImageIndex {
		return fail(fmt.Errorf("index.json should name one image index, names %d: %+v", len(im.Manifests), im.Manifests))
	}
	idx, err := top.ImageIndex(im.Manifests[0].Digest)
	if err != nil {
		return fail(err)
	}
	return idx, im.Manifests[0].Annotations["org.opencontainers.image.ref.name"], cleanup, nil
}

// inspect reads an OCI image archive back.
func inspect(file string) (summary, error) {
	idx, tag, cleanup, err := openArchive(file)
	if err != nil {
		return summary{}, err
	}
	defer cleanup()
	s := summary{Tag: tag}
	im, err := idx.IndexManifest()
	if err != nil {
		return s, err
	}
	s.MediaType, s.Annotations = im.MediaType, im.Annotations
	for _, d := range im.Manifests {
		is := imageSummary{MediaType: d.MediaType, Digest: d.Digest.String()}
		if d.Platform != nil {
			is.Platform = d.Platform.OS + "/" + d.Platform.Architecture
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			return s, err
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return s, err
		}
		is.OS, is.Arch, is.Config = cf.OS, cf.Architecture, cf.Config
		layers, err := img.Layers()
		if err != nil {
			return s, err
		}
		for _, l := range layers {
			ls, err := layerFiles(l)
			if err != nil {
				return s, err
			}
			is.Layers = append(is.Layers, ls)
		}
		s.Images = append(s.Images, is)
	}
	return s, nil
}

func layerFiles(l v1.Layer) (layerSummary, error) {
	var ls layerSummary
	mt, err := l.MediaType()
	if err != nil {
		return ls, err
	}
	ls.MediaType = mt
	rc, err := l.Uncompressed()
	if err != nil {
		return ls, err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return ls, nil
		}
		if err != nil {
			return ls, err
		}
		ls.Files = append(ls.Files, fileSummary{
			Name: h.Name, Mode: h.FileInfo().Mode().String(), UID: h.Uid, GID: h.Gid, Size: h.Size,
		})
	}
}

// untar unpacks the archive file into dir. It takes regular files and
// directories only, and no name that leaves dir.
func untar(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean(h.Name)
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("unsafe name %q", h.Name)
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			out, err := os.Create(target)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("%q: unexpected type %c", h.Name, h.Typeflag)
		}
	}
}
