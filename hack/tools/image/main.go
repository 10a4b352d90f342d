// Command image builds the gpulink container image as a docker-archive tar
// without a Docker engine or a registry (make image, through hack/image.sh,
// which downloads and unpacks the Debian packages it takes glibc and the CA
// certificates from). The contents are listed in contents.go and match
// deployments/container/Dockerfile.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func main() {
	repo := flag.String("repo", "", "root of the gpulink checkout to build the binaries from (required)")
	libc := flag.String("libc-root", "", "directory holding the unpacked libc6 package (dpkg -x) (required)")
	ca := flag.String("ca-root", "", "directory holding the unpacked ca-certificates package (dpkg -x) (required)")
	out := flag.String("out", "", "image archive to write (required)")
	ref := flag.String("ref", "gpulink.local/gpulink:dev", "image reference the archive is tagged with")
	version := flag.String("version", "dev", "org.opencontainers.image.version label")
	epoch := flag.Int64("source-date-epoch", 0, "timestamp (Unix seconds) of every file and of the image, for reproducible builds")
	goCmd := flag.String("go", "go", "go command")
	flag.Parse()
	for _, f := range []struct{ name, value string }{{"repo", *repo}, {"libc-root", *libc}, {"ca-root", *ca}, {"out", *out}} {
		if f.value == "" {
			fmt.Fprintf(os.Stderr, "image: --%s is required\n", f.name)
			flag.Usage()
			os.Exit(2)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *repo, *libc, *ca, *out, *ref, *version, *goCmd, time.Unix(*epoch, 0).UTC()); err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, repo, libcRoot, caRoot, out, ref, version, goCmd string, mtime time.Time) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	binOut, err := os.MkdirTemp(filepath.Dir(out), ".bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(binOut)
	arch := hostArch()
	if err := buildBinaries(ctx, goCmd, repo, binOut, arch); err != nil {
		return err
	}
	base, err := baseLayer(libcRoot, caRoot, mtime)
	if err != nil {
		return err
	}
	bins := newLayer(mtime)
	for _, b := range binaries {
		p := filepath.Join(binOut, b.name)
		versions, err := checkDynamic(p, libcRoot)
		if err != nil {
			return fmt.Errorf("%s cannot run on the image's glibc: %w", b.name, err)
		}
		if len(versions) > 0 {
			fmt.Fprintf(os.Stderr, "image: %s: dynamic, the image's glibc defines every version it needs (%s)\n",
				b.name, newestGlibc(versions))
		}
		if err := bins.addFile(binDir+"/"+b.name, p, 0o755); err != nil {
			return err
		}
	}
	digest, err := writeImage(imageSpec{
		ref: ref, version: version, arch: arch, created: mtime,
		layers:  []*layer{base, bins},
		history: []string{"gpulink hack/image.sh: glibc, CA certificates, users (Debian packages)", "gpulink hack/image.sh: binaries"},
	}, out)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "image: %s %s\n", ref, digest)
	return nil
}

// newestGlibc returns the highest GLIBC_x.y among versions ("libc.so.6:GLIBC_2.34").
func newestGlibc(versions []string) string {
	best, bestMaj, bestMin := "", -1, -1
	for _, v := range versions {
		_, ver, _ := strings.Cut(v, ":")
		var maj, mnr int
		if n, _ := fmt.Sscanf(ver, "GLIBC_%d.%d", &maj, &mnr); n < 2 {
			continue
		}
		if maj > bestMaj || (maj == bestMaj && mnr > bestMin) {
			best, bestMaj, bestMin = ver, maj, mnr
		}
	}
	return "needs up to " + best
}
