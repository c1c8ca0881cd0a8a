//go:build !unix

package pollfile

import "os"

// fileKey has no inode to offer here: changes are seen through the
// modification time and size only.
func fileKey(os.FileInfo) (ino, dev uint64) { return 0, 0 }
