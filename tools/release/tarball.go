package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"time"
)

// entry is one file or directory of a reproducible tar archive.
type entry struct {
	Name string // slash-separated, relative; directories end in "/"
	Mode int64
	UID  int
	GID  int
	Data []byte
}

// reproducibleTar writes entries sorted by name, with the given owners and
// modes, every mtime set to epoch, no user or group names and no PAX
// timestamps, so that the same inputs always give the same bytes. Parent
// directories that were not listed are added (0755, root).
func reproducibleTar(entries []entry, epoch time.Time) ([]byte, error) {
	byName := map[string]entry{}
	for _, e := range entries {
		if _, dup := byName[e.Name]; dup {
			return nil, fmt.Errorf("tar entry %q listed twice", e.Name)
		}
		byName[e.Name] = e
	}
	for _, e := range entries {
		for dir := path.Dir(strings.TrimSuffix(e.Name, "/")); dir != "." && dir != "/"; dir = path.Dir(dir) {
			if _, ok := byName[dir+"/"]; !ok {
				byName[dir+"/"] = entry{Name: dir + "/", Mode: 0o755}
			}
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	slices.Sort(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := byName[n]
		h := &tar.Header{
			Name:    e.Name,
			Mode:    e.Mode,
			Uid:     e.UID,
			Gid:     e.GID,
			ModTime: epoch,
			Format:  tar.FormatUSTAR,
		}
		if strings.HasSuffix(e.Name, "/") {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("tar header %s: %w", e.Name, err)
		}
		if _, err := tw.Write(e.Data); err != nil {
			return nil, fmt.Errorf("tar data %s: %w", e.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("closing tar: %w", err)
	}
	return buf.Bytes(), nil
}

// gzipBytes compresses b with a header that carries no name and no mtime.
func gzipBytes(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(b); err != nil {
		return nil, fmt.Errorf("gzip: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("gzip: %w", err)
	}
	return buf.Bytes(), nil
}

// readTar returns the headers of a tar stream in order and its regular
// files' contents by name.
func readTar(r io.Reader) ([]*tar.Header, map[string][]byte, error) {
	var headers []*tar.Header
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return headers, files, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("reading tar: %w", err)
		}
		headers = append(headers, h)
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				return nil, nil, fmt.Errorf("reading %s: %w", h.Name, err)
			}
			files[h.Name] = b
		}
	}
}

// headerByName finds an entry's header.
func headerByName(headers []*tar.Header, name string) *tar.Header {
	for _, h := range headers {
		if h.Name == name {
			return h
		}
	}
	return nil
}
