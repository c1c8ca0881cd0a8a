//go:build unix

package pollfile

import (
	"os"
	"syscall"
)

// fileKey returns the inode and device of a file: a file replaced by a
// rename (as Kubernetes updates mounted Secrets) gets a new key.
func fileKey(fi os.FileInfo) (ino, dev uint64) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino, uint64(st.Dev) //nolint:unconvert // Dev is uint64 on linux/amd64 but not everywhere
	}
	return 0, 0
}
