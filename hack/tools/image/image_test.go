package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeDebs lays out what dpkg -x of libc6 and ca-certificates gives, in
// miniature: a loader, libc, a symlink, docs and gconv to be dropped, and
// two certificates.
func fakeDebs(t *testing.T) (libc, ca string) {
	t.Helper()
	dir := t.TempDir()
	libc, ca = filepath.Join(dir, "libc6"), filepath.Join(dir, "ca")
	files := map[string]string{
		"libc6/lib/x86_64-linux-gnu/libc.so.6":            "libc",
		"libc6/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2": "ld",
		"libc6/usr/share/doc/libc6/copyright":             "doc",
		"libc6/usr/lib/x86_64-linux-gnu/gconv/UTF-16.so":  "gconv",
		"ca/usr/share/ca-certificates/mozilla/B.crt":      "-----BEGIN CERTIFICATE-----\nB\n-----END CERTIFICATE-----",
		"ca/usr/share/ca-certificates/mozilla/A.crt":      "-----BEGIN CERTIFICATE-----\nA\n-----END CERTIFICATE-----\n",
		"ca/usr/sbin/update-ca-certificates":              "#!/bin/sh",
	}
	for p, data := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(libc, "lib64"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", filepath.Join(libc, "lib64/ld-linux-x86-64.so.2")); err != nil {
		t.Fatal(err)
	}
	return libc, ca
}

func layerEntries(t *testing.T, l *layer) (names []string, headers map[string]*tar.Header, data map[string]string) {
	t.Helper()
	var buf bytes.Buffer
	if err := l.writeTo(&buf); err != nil {
		t.Fatal(err)
	}
	headers, data = map[string]*tar.Header{}, map[string]string{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		names = append(names, h.Name)
		headers[h.Name], data[h.Name] = h, string(b)
	}
	return names, headers, data
}

func TestBaseLayer(t *testing.T) {
	libc, ca := fakeDebs(t)
	l, err := baseLayer(libc, ca, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	names, hdr, data := layerEntries(t, l)
	for _, want := range []string{"lib/x86_64-linux-gnu/libc.so.6", "lib64/ld-linux-x86-64.so.2", "etc/passwd", "etc/group", "tmp/", "home/nonroot/", caBundle} {
		if hdr[want] == nil {
			t.Errorf("base layer lacks %s; has %v", want, names)
		}
	}
	for _, n := range names {
		if strings.Contains(n, "usr/share/doc") || strings.Contains(n, "gconv") || strings.Contains(n, "update-ca-certificates") {
			t.Errorf("base layer holds %s, which the image does not need", n)
		}
	}
	if got := hdr["tmp/"].Mode; got != 0o1777 {
		t.Errorf("/tmp mode %o, want 1777", got)
	}
	if h := hdr["home/nonroot/"]; h.Uid != 65532 || h.Gid != 65532 {
		t.Errorf("/home/nonroot owned by %d:%d, want 65532:65532", h.Uid, h.Gid)
	}
	if !strings.Contains(data["etc/passwd"], "nonroot:x:65532:65532:") || !strings.Contains(data["etc/group"], "nonroot:x:65532:") {
		t.Errorf("no nonroot 65532 in passwd/group:\n%s\n%s", data["etc/passwd"], data["etc/group"])
	}
	if want := "-----BEGIN CERTIFICATE-----\nA\n-----END CERTIFICATE-----\n-----BEGIN CERTIFICATE-----\nB\n-----END CERTIFICATE-----\n"; data[caBundle] != want {
		t.Errorf("CA bundle = %q, want the certificates in name order, newline-terminated: %q", data[caBundle], want)
	}
	if h := hdr["lib64/ld-linux-x86-64.so.2"]; h.Typeflag != tar.TypeSymlink || h.Linkname != "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" {
		t.Errorf("loader symlink = %+v", h)
	}
}

func TestBaseLayerNeedsCertificates(t *testing.T) {
	libc, _ := fakeDebs(t)
	_, err := baseLayer(libc, t.TempDir(), time.Unix(0, 0))
	if err == nil || !strings.Contains(err.Error(), "no CA certificates") {
		t.Fatalf("err = %v, want a missing-certificates error", err)
	}
}

// TestLayerReproducible: entries come out sorted with the fixed time and
// root ownership whatever the order they were added in, and two builds of
// the same inputs are byte-identical.
func TestLayerReproducible(t *testing.T) {
	build := func(order []string) []byte {
		l := newLayer(time.Unix(42, 0))
		for _, n := range order {
			if err := l.addData(n, []byte(n), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		var buf bytes.Buffer
		if err := l.writeTo(&buf); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	a := build([]string{"usr/bin/b", "etc/x", "usr/bin/a"})
	b := build([]string{"usr/bin/a", "usr/bin/b", "etc/x"})
	if !bytes.Equal(a, b) {
		t.Fatal("the same entries added in another order give another layer")
	}
	l := newLayer(time.Unix(42, 0))
	for _, n := range []string{"usr/bin/b", "etc/x", "usr/bin/a"} {
		_ = l.addData(n, nil, 0o644)
	}
	names, hdr, _ := layerEntries(t, l)
	if got, want := strings.Join(names, " "), "etc/ etc/x usr/ usr/bin/ usr/bin/a usr/bin/b"; got != want {
		t.Errorf("entries %q, want %q", got, want)
	}
	for n, h := range hdr {
		if !h.ModTime.Equal(time.Unix(42, 0)) || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: mtime %v owner %d:%d, want the fixed time and root", n, h.ModTime, h.Uid, h.Gid)
		}
	}
}

func TestLayerRejectsEscapes(t *testing.T) {
	l := newLayer(time.Unix(0, 0))
	if err := l.addData("../etc/passwd", nil, 0o644); err == nil {
		t.Fatal("a path outside the image root was accepted")
	}
	_ = l.addData("etc/file", nil, 0o644)
	if err := l.addData("etc/file/sub", nil, 0o644); err == nil {
		t.Fatal("an entry under a regular file was accepted")
	}
}
