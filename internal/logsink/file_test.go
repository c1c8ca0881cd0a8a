package logsink

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// A real rename and Reopen while a writer goes on writing through the
// bounded Writer: the lines before the reopen are in the renamed file, the
// lines after it in a new file of the old name, every line exactly once.
func TestFileReopenAfterRename(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "access.log")
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	w := New(f, 1<<16, time.Hour, false)

	const lines = 20000
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range lines {
			_, _ = fmt.Fprintf(w, "line %d\n", i)
			if i%1000 == 0 {
				time.Sleep(time.Millisecond) // let the rotation land mid-stream
			}
		}
	})
	// Rotate while lines are being written: rename, then reopen.
	rotated := filepath.Join(dir, "access.log.1")
	testutil.Eventually(t, 10*time.Second, "first lines written", func() bool { return fileSize(t, path) > 0 })
	if err := os.Rename(path, rotated); err != nil {
		t.Fatal(err)
	}
	if err := f.Reopen(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	w.Close(5 * time.Second)
	if d := w.Dropped(); d != 0 {
		t.Fatalf("%d lines dropped (queue large enough for all)", d)
	}

	seen := make([]int, lines)
	old, cur := readLines(t, rotated), readLines(t, path)
	if len(old) == 0 || len(cur) == 0 {
		t.Fatalf("rotated file %d lines, new file %d lines: want both non-empty", len(old), len(cur))
	}
	for _, l := range append(old, cur...) {
		n, err := strconv.Atoi(strings.TrimPrefix(l, "line "))
		if err != nil || n < 0 || n >= lines {
			t.Fatalf("bad line %q", l)
		}
		seen[n]++
	}
	for i, c := range seen {
		if c != 1 {
			t.Fatalf("line %d written %d times", i, c)
		}
	}
	// The new file's lines all come after the rotated file's.
	last, _ := strconv.Atoi(strings.TrimPrefix(old[len(old)-1], "line "))
	first, _ := strconv.Atoi(strings.TrimPrefix(cur[0], "line "))
	if first != last+1 {
		t.Errorf("rotated file ends at line %d, new file starts at %d", last, first)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != FileMode {
		t.Errorf("new file mode %v (%v), want %v", fi.Mode().Perm(), err, os.FileMode(FileMode))
	}
}

// A name that cannot be reopened keeps the old file in use.
func TestFileReopenFailureKeepsFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "diag.log")
	if err := os.Mkdir(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	moved := filepath.Join(dir, "moved")
	if err := os.Rename(filepath.Dir(path), moved); err != nil {
		t.Fatal(err)
	}
	if err := f.Reopen(); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Reopen of a vanished directory: %v, want an error naming %s", err, path)
	}
	if _, err := f.Write([]byte("still here\n")); err != nil {
		t.Fatal(err)
	}
	if got := readLines(t, filepath.Join(moved, "diag.log")); len(got) != 1 || got[0] != "still here" {
		t.Errorf("old file holds %q", got)
	}
	_ = f.Close()
	if _, err := f.Write([]byte("x\n")); err == nil {
		t.Error("write after Close succeeded")
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fh.Close() }()
	var out []string
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

func fileSize(t *testing.T, path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
