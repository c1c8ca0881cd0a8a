package tlsconf

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// File names inside a Kubernetes TLS Secret directory.
const (
	// CertFile is the name of the PEM certificate chain (leaf first) in a
	// TLS Secret directory.
	CertFile = "tls.crt"
	// KeyFile is the name of the PEM private key in a TLS Secret directory.
	KeyFile = "tls.key"
)

// dataLink is the symlink through which a Kubernetes Secret volume exposes
// its current payload directory.
const dataLink = "..data"

// WriteKeyPair writes certPEM to dir/tls.crt (mode 0644) and keyPEM to
// dir/tls.key (mode 0600), creating dir if needed. Each file is replaced
// atomically (written to a temporary file, then renamed), but the two files
// are replaced one after the other: a [Store] watching dir may briefly see a
// certificate that does not match its key, reject it, and pick up the pair on
// the next change. Use [WriteSecretDir] to swap both at once.
func WriteKeyPair(dir string, certPEM, keyPEM []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("tlsconf: write key pair: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(dir, KeyFile), keyPEM, 0o600); err != nil {
		return fmt.Errorf("tlsconf: write key pair: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(dir, CertFile), certPEM, 0o644); err != nil {
		return fmt.Errorf("tlsconf: write key pair: %w", err)
	}
	return nil
}

// WriteSecretDir writes a certificate pair the way the kubelet updates a
// Secret volume, which is how tests simulate a Secret rotation:
//
//  1. the files go into a new timestamped directory dir/..YYYY_MM_DD_hh_mm_ss.nnnnnnnnn_N
//     (tls.crt mode 0644, tls.key mode 0600);
//  2. a temporary symlink to it is renamed over dir/..data, which switches
//     both files at once;
//  3. dir/tls.crt -> ..data/tls.crt and dir/tls.key -> ..data/tls.key are
//     created if they are not already in place;
//  4. the previous timestamped directory is removed.
//
// dir is created if needed.
func WriteSecretDir(dir string, certPEM, keyPEM []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("tlsconf: write secret dir: %w", err)
	}
	prefix := time.Now().UTC().Format("..2006_01_02_15_04_05.000000000") + "_"
	payload, err := os.MkdirTemp(dir, prefix)
	if err != nil {
		return fmt.Errorf("tlsconf: write secret dir %s: %w", dir, err)
	}
	swapped := false
	defer func() {
		if !swapped {
			_ = os.RemoveAll(payload)
		}
	}()
	if err := os.Chmod(payload, 0o755); err != nil {
		return fmt.Errorf("tlsconf: write secret dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(payload, CertFile), certPEM, 0o644); err != nil {
		return fmt.Errorf("tlsconf: write secret dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(payload, KeyFile), keyPEM, 0o600); err != nil {
		return fmt.Errorf("tlsconf: write secret dir: %w", err)
	}

	dataPath := filepath.Join(dir, dataLink)
	oldPayload, err := os.Readlink(dataPath)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("tlsconf: write secret dir: %w", err)
	}
	if err := replaceSymlink(dataPath, filepath.Base(payload)); err != nil {
		return fmt.Errorf("tlsconf: write secret dir: swap %s: %w", dataPath, err)
	}
	swapped = true

	for _, name := range []string{CertFile, KeyFile} {
		link, target := filepath.Join(dir, name), filepath.Join(dataLink, name)
		if cur, err := os.Readlink(link); err == nil && cur == target {
			continue
		}
		if err := replaceSymlink(link, target); err != nil {
			return fmt.Errorf("tlsconf: write secret dir: link %s: %w", link, err)
		}
	}

	if isPayloadDirName(oldPayload) && oldPayload != filepath.Base(payload) {
		if err := os.RemoveAll(filepath.Join(dir, oldPayload)); err != nil {
			return fmt.Errorf("tlsconf: write secret dir: remove previous payload: %w", err)
		}
	}
	return nil
}

// replaceSymlink atomically points link at target: it creates a temporary
// symlink next to link and renames it over link.
func replaceSymlink(link, target string) error {
	tmp := filepath.Join(filepath.Dir(link), "..tmp"+filepath.Base(link))
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Symlink(target, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, link); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// isPayloadDirName reports whether name looks like a payload directory made
// by WriteSecretDir (or the kubelet): "..<digit>...", a single path element.
// It never matches "..", "..data" or a path that leaves the directory.
func isPayloadDirName(name string) bool {
	return len(name) > 2 && name[0] == '.' && name[1] == '.' &&
		name[2] >= '0' && name[2] <= '9' && filepath.Base(name) == name
}

// writeFileAtomic replaces path with data: it writes a temporary file in the
// same directory, syncs it and renames it over path.
func writeFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	if err = f.Chmod(perm); err != nil {
		return err
	}
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return err
	}
	return nil
}
