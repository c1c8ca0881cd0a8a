//go:build !unix

package dispatch

import "syscall"

// rawSource: outside Unix every direction reads with its reader.
func (p *wsPump) rawSource() syscall.RawConn { return nil }

func (p *wsPump) copyRaw(syscall.RawConn, []byte) (bool, error, error) {
	panic("copyRaw without a raw source")
}
