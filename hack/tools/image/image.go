package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// imageSpec is everything an image is assembled from.
type imageSpec struct {
	ref     string
	version string
	arch    string
	created time.Time
	layers  []*layer // bottom first
	history []string // created_by of each layer
}

// writeImage assembles the image and writes it to out as a docker-archive
// tar (manifest.json, config, gzip layers) tagged spec.ref, which
// `ctr images import`, `kind load image-archive` and `docker load` accept.
// The archive is written next to out and renamed, so out is never partial.
func writeImage(spec imageSpec, out string) (v1.Hash, error) {
	tag, err := name.NewTag(spec.ref)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image reference %q: %w", spec.ref, err)
	}
	work, err := os.MkdirTemp(filepath.Dir(out), ".image-")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.RemoveAll(work)

	img := empty.Image
	for i, l := range spec.layers {
		p := filepath.Join(work, fmt.Sprintf("layer-%d.tar", i))
		f, err := os.Create(p)
		if err != nil {
			return v1.Hash{}, err
		}
		if err := l.writeTo(f); err != nil {
			f.Close()
			return v1.Hash{}, fmt.Errorf("writing layer %d: %w", i, err)
		}
		if err := f.Close(); err != nil {
			return v1.Hash{}, err
		}
		tl, err := tarball.LayerFromFile(p)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("layer %d: %w", i, err)
		}
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:   tl,
			History: v1.History{Created: v1.Time{Time: spec.created}, CreatedBy: spec.history[i]},
		})
		if err != nil {
			return v1.Hash{}, fmt.Errorf("appending layer %d: %w", i, err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return v1.Hash{}, err
	}
	cf = cf.DeepCopy()
	cf.Architecture = spec.arch
	cf.OS = "linux"
	cf.Created = v1.Time{Time: spec.created}
	cf.Config = v1.Config{
		User:       fmt.Sprintf("%d:%d", nonrootID, nonrootID),
		Entrypoint: []string{entrypoint},
		Env: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"SSL_CERT_FILE=/" + caBundle,
		},
		WorkingDir: "/",
		Labels:     labels(spec.version),
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("setting the image config: %w", err)
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	tmp := filepath.Join(work, "image.tar")
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		return v1.Hash{}, fmt.Errorf("writing %s: %w", out, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return v1.Hash{}, err
	}
	return digest, nil
}
