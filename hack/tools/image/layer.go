package main

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// entry is one file system object of a layer. Exactly one of data and src
// is used for regular files: data for generated files, src for files copied
// from disk (read only when the layer is written, so large binaries are not
// held in memory).
type entry struct {
	name     string // clean, relative ("usr/bin/gpulink")
	typeflag byte   // tar.TypeDir, tar.TypeReg or tar.TypeSymlink
	mode     int64  // permission bits (and sticky etc.)
	uid, gid int
	linkname string // symlinks only
	data     []byte
	src      string
}

// layer collects the entries of one image layer. Parent directories are
// added implicitly (root-owned, 0755) and entries are written sorted by
// name with fixed timestamps, so the same inputs give the same layer digest.
type layer struct {
	entries map[string]*entry
	mtime   time.Time
}

func newLayer(mtime time.Time) *layer {
	return &layer{entries: map[string]*entry{}, mtime: mtime}
}

// add records e, replacing an earlier entry of the same name, and creates
// its parent directories unless they exist already.
func (l *layer) add(e entry) error {
	name := path.Clean(strings.TrimPrefix(e.name, "/"))
	if name == "." || name == ".." || strings.HasPrefix(name, "../") {
		return fmt.Errorf("layer entry %q: path outside the image root", e.name)
	}
	e.name = name
	for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
		if parent, ok := l.entries[dir]; ok {
			if parent.typeflag != tar.TypeDir {
				return fmt.Errorf("layer entry %q: parent %q is not a directory", name, dir)
			}
			continue
		}
		l.entries[dir] = &entry{name: dir, typeflag: tar.TypeDir, mode: 0o755}
	}
	if old, ok := l.entries[name]; ok && old.typeflag == tar.TypeDir && e.typeflag == tar.TypeDir {
		// An explicit directory refines an implicit one (mode, owner).
		*old = e
		return nil
	}
	l.entries[name] = &e
	return nil
}

// addFile adds the regular file at src as name with mode.
func (l *layer) addFile(name, src string, mode int64) error {
	return l.add(entry{name: name, typeflag: tar.TypeReg, mode: mode, src: src})
}

// addData adds a generated regular file.
func (l *layer) addData(name string, data []byte, mode int64) error {
	return l.add(entry{name: name, typeflag: tar.TypeReg, mode: mode, data: data})
}

// addTree adds every directory, regular file and symlink under root as the
// same path relative to the image root; skip reports paths (relative,
// slash-separated) to leave out, directories with their contents.
func (l *layer) addTree(root string, skip func(rel string) bool) error {
	return walkTree(root, func(rel string, info fs.FileInfo, full string) error {
		if skip != nil && skip(rel) {
			if info.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		perm := int64(info.Mode().Perm())
		switch {
		case info.IsDir():
			return l.add(entry{name: rel, typeflag: tar.TypeDir, mode: perm})
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(full)
			if err != nil {
				return fmt.Errorf("reading symlink %s: %w", full, err)
			}
			return l.add(entry{name: rel, typeflag: tar.TypeSymlink, mode: 0o777, linkname: target})
		case info.Mode().IsRegular():
			return l.addFile(rel, full, perm)
		default:
			return fmt.Errorf("%s: unsupported file type %s", full, info.Mode().Type())
		}
	})
}

// walkTree calls fn for everything under root except root itself, with the
// slash-separated path relative to root.
func walkTree(root string, fn func(rel string, info fs.FileInfo, full string) error) error {
	return walkDir(root, root, fn)
}

func walkDir(root, dir string, fn func(rel string, info fs.FileInfo, full string) error) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("reading %s: %w", dir, err)
	}
	for _, de := range des {
		full := dir + "/" + de.Name()
		info, err := os.Lstat(full)
		if err != nil {
			return fmt.Errorf("reading %s: %w", full, err)
		}
		rel := strings.TrimPrefix(full, root+"/")
		if err := fn(rel, info, full); err == fs.SkipDir {
			continue
		} else if err != nil {
			return err
		}
		if info.IsDir() {
			if err := walkDir(root, full, fn); err != nil {
				return err
			}
		}
	}
	return nil
}

// names returns the entry names in the order they are written.
func (l *layer) names() []string {
	names := make([]string, 0, len(l.entries))
	for n := range l.entries {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// writeTo writes the layer as an uncompressed tar.
func (l *layer) writeTo(w io.Writer) error {
	tw := tar.NewWriter(w)
	for _, n := range l.names() {
		if err := l.writeEntry(tw, l.entries[n]); err != nil {
			return fmt.Errorf("layer entry %s: %w", n, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("closing layer: %w", err)
	}
	return nil
}

func (l *layer) writeEntry(tw *tar.Writer, e *entry) error {
	hdr := &tar.Header{
		Typeflag: e.typeflag,
		Name:     e.name,
		Linkname: e.linkname,
		Mode:     e.mode,
		Uid:      e.uid,
		Gid:      e.gid,
		ModTime:  l.mtime,
		Format:   tar.FormatPAX,
	}
	switch e.typeflag {
	case tar.TypeDir:
		hdr.Name += "/"
		return tw.WriteHeader(hdr)
	case tar.TypeSymlink:
		return tw.WriteHeader(hdr)
	}
	if e.src == "" {
		hdr.Size = int64(len(e.data))
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(e.data)
		return err
	}
	f, err := os.Open(e.src)
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	hdr.Size = info.Size()
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	// tar.Writer refuses to write more than hdr.Size and Close reports a
	// short file, so a file that changes while it is read is an error.
	_, err = io.Copy(tw, f)
	return err
}
