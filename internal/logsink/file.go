package logsink

import (
	"fmt"
	"os"
	"sync"
)

// File is a log file that can be reopened by name: logrotate's convention
// (rename the file, then signal the process) moves the lines written after
// Reopen into a new file of the old name, while the lines written before
// it stay in the renamed one. Nothing is lost between the two: Write and
// Reopen take turns under one lock.
type File struct {
	path string

	mu sync.Mutex
	f  *os.File
}

// FileMode is the permission of a log file the process creates: readable
// by its group (log shippers), never by others.
const FileMode = 0o640

// OpenFile opens path for appending, creating it when it does not exist.
func OpenFile(path string) (*File, error) {
	f, err := openAppend(path)
	if err != nil {
		return nil, err
	}
	return &File{path: path, f: f}, nil
}

func openAppend(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, FileMode)
	if err != nil {
		return nil, fmt.Errorf("log file %s: %w", path, err)
	}
	return f, nil
}

// Path is the name the file was opened by.
func (l *File) Path() string { return l.path }

// Write appends p to the file open now.
func (l *File) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return 0, os.ErrClosed
	}
	return l.f.Write(p)
}

// Reopen opens the file by its name again (creating it after a rename) and
// closes the one it replaces. When the name cannot be opened, the old file
// stays in use and the error is returned.
func (l *File) Reopen() error {
	f, err := openAppend(l.path)
	if err != nil {
		return err
	}
	l.mu.Lock()
	old := l.f
	l.f = f
	l.mu.Unlock()
	if old != nil {
		return old.Close()
	}
	return nil
}

// Close closes the file; later writes fail.
func (l *File) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
