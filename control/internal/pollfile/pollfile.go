// Package pollfile is what the supervisor's routes file source and the
// reference gateway share to poll a file for changes: its stat identity,
// and reading it whole with a size limit.
package pollfile

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"time"
)

// Identity is what tells one version of a file from another without
// reading it: modification time, size, inode and device. The zero Identity
// is no file.
type Identity struct {
	mod   time.Time
	size  int64
	ino   uint64
	dev   uint64
	valid bool
}

// Valid reports whether the identity is one of a file that was there.
func (id Identity) Valid() bool { return id.valid }

// Stat returns the identity of the file at path.
func Stat(path string) (Identity, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Identity{}, err
	}
	id := Identity{mod: fi.ModTime(), size: fi.Size(), valid: true}
	id.ino, id.dev = fileKey(fi)
	return id, nil
}

// ReadLimited reads the file at path, refusing one larger than limit bytes.
func ReadLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	// Size the buffer from the file once instead of doubling it.
	var buf bytes.Buffer
	if fi, err := f.Stat(); err == nil && fi.Size() > 0 && fi.Size() <= limit {
		buf.Grow(int(fi.Size()) + 1)
	}
	n, err := io.Copy(&buf, io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if n > limit {
		return nil, fmt.Errorf("read %s: larger than %d bytes", path, limit)
	}
	return buf.Bytes(), nil
}
