//go:build !unix

package tlsconf

import "io/fs"

// fileID returns zeros where inode numbers are not available; Watch then
// relies on the modification time, size and resolved path.
func fileID(fs.FileInfo) (dev, ino uint64) {
	return 0, 0
}
