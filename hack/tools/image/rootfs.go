package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// baseLayer returns the layer under the binaries: glibc from the unpacked
// libc6 package at libcRoot, the CA bundle built from the unpacked
// ca-certificates package at caRoot, the user database with the nonroot
// user, /tmp and the nonroot home. This is what the Dockerfile's
// distroless/base runtime image provides for gpulink.
func baseLayer(libcRoot, caRoot string, mtime time.Time) (*layer, error) {
	l := newLayer(mtime)
	if err := l.addTree(libcRoot, skipLibc); err != nil {
		return nil, fmt.Errorf("adding glibc from %s: %w", libcRoot, err)
	}
	bundle, err := caBundleFrom(caRoot)
	if err != nil {
		return nil, err
	}
	files := []struct {
		name string
		data []byte
		mode int64
	}{
		{caBundle, bundle, 0o644},
		{"etc/passwd", []byte(passwd()), 0o644},
		{"etc/group", []byte(group()), 0o644},
		// Host lookups through /etc/hosts first, as glibc's and Go's
		// resolvers expect on a Debian system.
		{"etc/nsswitch.conf", []byte("passwd: files\ngroup: files\nhosts: files dns\n"), 0o644},
	}
	for _, f := range files {
		if err := l.addData(f.name, f.data, f.mode); err != nil {
			return nil, err
		}
	}
	dirs := []entry{
		{name: "tmp", mode: 0o1777},
		{name: "root", mode: 0o700},
		{name: "home/" + nonrootName, mode: 0o700, uid: nonrootID, gid: nonrootID},
		{name: binDir, mode: 0o755},
	}
	for _, d := range dirs {
		d.typeflag = tar.TypeDir
		if err := l.add(d); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// skipLibc leaves out what nothing in the image uses: documentation, the
// lintian overrides and the iconv modules (Go does no character set
// conversion, NVML neither).
func skipLibc(rel string) bool {
	for _, p := range []string{"usr/share/doc", "usr/share/lintian", "usr/share/man", "usr/share/info"} {
		if rel == p || strings.HasPrefix(rel, p+"/") {
			return true
		}
	}
	return filepath.Base(rel) == "gconv" && !strings.HasPrefix(rel, "etc/")
}

// caBundleFrom concatenates the Mozilla certificates of the unpacked
// ca-certificates package in name order, as update-ca-certificates does
// when the package is installed (dpkg -x runs no maintainer scripts).
func caBundleFrom(caRoot string) ([]byte, error) {
	dir := filepath.Join(caRoot, "usr/share/ca-certificates/mozilla")
	matches, err := filepath.Glob(filepath.Join(dir, "*.crt"))
	if err != nil {
		return nil, fmt.Errorf("listing CA certificates in %s: %w", dir, err)
	}
	if len(matches) == 0 {
		return nil, fmt.Errorf("no CA certificates (*.crt) in %s: is it an unpacked ca-certificates package?", dir)
	}
	sort.Strings(matches)
	var buf bytes.Buffer
	for _, m := range matches {
		data, err := os.ReadFile(m)
		if err != nil {
			return nil, fmt.Errorf("reading CA certificate: %w", err)
		}
		if !bytes.Contains(data, []byte("-----BEGIN CERTIFICATE-----")) {
			return nil, fmt.Errorf("CA certificate %s holds no PEM certificate", m)
		}
		buf.Write(data)
		if !bytes.HasSuffix(data, []byte("\n")) {
			buf.WriteByte('\n')
		}
	}
	return buf.Bytes(), nil
}

// passwd and group hold root, nobody and the nonroot user that the image
// runs as by default (the distroless convention: uid/gid 65532).
func passwd() string {
	return fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\n"+
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"+
		"%[1]s:x:%[2]d:%[2]d:%[1]s:/home/%[1]s:/sbin/nologin\n", nonrootName, nonrootID)
}

func group() string {
	return fmt.Sprintf("root:x:0:\nnogroup:x:65534:\n%[1]s:x:%[2]d:\n", nonrootName, nonrootID)
}
