package main

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// Image layout: where the binary and the files it needs live.
const (
	imageBinary  = "usr/local/bin/applistener"
	imageCAFile  = "etc/ssl/certs/ca-certificates.crt"
	nonRootID    = 65532
	imageUserStr = "65532:65532"
)

// imageSpec is what every per-platform image shares.
type imageSpec struct {
	Version    string
	Commit     string
	Epoch      time.Time
	Repository string // e.g. ghcr.io/applistener/applistener
	Source     string // org.opencontainers.image.source
}

func (s imageSpec) labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "applistener",
		"org.opencontainers.image.description": "Sandbox application listener: SNI-routed TLS to sandbox loopback apps",
		"org.opencontainers.image.source":      s.Source,
		"org.opencontainers.image.url":         s.Source,
		"org.opencontainers.image.version":     s.Version,
		"org.opencontainers.image.revision":    s.Commit,
		"org.opencontainers.image.created":     s.Epoch.UTC().Format(time.RFC3339),
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
}

// caBundle is the PEM bundle of the NSS roots that golang.org/x/crypto's
// x509roots/fallback/bundle pins (its version is in this module's go.sum, so
// the bundle does not depend on the build machine). Roots that NSS trusts
// only with a distrust-after date are left out: a PEM file cannot carry
// that constraint.
func caBundle() ([]byte, int, error) {
	var buf bytes.Buffer
	n := 0
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		if _, err := x509.ParseCertificate(r.Certificate); err != nil {
			return nil, 0, fmt.Errorf("root certificate %d does not parse: %w", n, err)
		}
		if err := pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, 0, err
		}
		n++
	}
	if n == 0 {
		return nil, 0, fmt.Errorf("the CA bundle is empty")
	}
	return buf.Bytes(), n, nil
}

// rootFS is the image's one layer: the binary, the CA bundle, passwd and
// group naming the non-root user, its home and /tmp.
func rootFS(binary, ca []byte, epoch time.Time) ([]byte, error) {
	passwd := "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group := "root:x:0:\nnonroot:x:65532:\n"
	return reproducibleTar([]entry{
		{Name: imageBinary, Mode: 0o755, Data: binary},
		{Name: imageCAFile, Mode: 0o644, Data: ca},
		{Name: "etc/passwd", Mode: 0o644, Data: []byte(passwd)},
		{Name: "etc/group", Mode: 0o644, Data: []byte(group)},
		{Name: "home/nonroot/", Mode: 0o700, UID: nonRootID, GID: nonRootID},
		{Name: "tmp/", Mode: 0o1777},
	}, epoch)
}

// buildImage builds one platform's image from scratch.
func buildImage(spec imageSpec, platform v1.Platform, binary, ca []byte) (v1.Image, error) {
	fs, err := rootFS(binary, ca, spec.Epoch)
	if err != nil {
		return nil, err
	}
	gz, err := gzipBytes(fs)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gz)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: spec.Epoch},
			CreatedBy: "applistener tools/release: " + imageBinary + ", CA bundle, passwd/group (uid 65532)",
			Comment:   "built without a container runtime",
		},
	})
	if err != nil {
		return nil, fmt.Errorf("appending the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS = platform.OS
	cf.Architecture = platform.Architecture
	cf.Variant = platform.Variant
	cf.Created = v1.Time{Time: spec.Epoch}
	cf.Author = "applistener"
	cf.Config = v1.Config{
		User:       imageUserStr,
		Entrypoint: []string{"/" + imageBinary},
		Cmd:        []string{"serve"},
		Env: []string{
			"PATH=/usr/local/bin",
			"SSL_CERT_FILE=/" + imageCAFile,
		},
		WorkingDir: "/home/nonroot",
		ExposedPorts: map[string]struct{}{
			"8443/tcp": {}, "5501/tcp": {}, "9090/tcp": {},
		},
		Labels: spec.labels(),
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("setting the config: %w", err)
	}
	ann, ok := mutate.Annotations(img, spec.labels()).(v1.Image)
	if !ok {
		return nil, fmt.Errorf("annotating the image: unexpected type")
	}
	return ann, nil
}

// platformImage is one image of the index with its binary's platform.
type platformImage struct {
	Platform v1.Platform
	Image    v1.Image
}

// buildIndex puts the per-platform images into one OCI image index.
func buildIndex(spec imageSpec, imgs []platformImage) (v1.ImageIndex, error) {
	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, pi := range imgs {
		p := pi.Platform
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        pi.Image,
			Descriptor: v1.Descriptor{Platform: &p},
		})
	}
	ann, ok := mutate.Annotations(idx, spec.labels()).(v1.ImageIndex)
	if !ok {
		return nil, fmt.Errorf("annotating the index: unexpected type")
	}
	return ann, nil
}

// ociLayoutTar writes the index as an OCI image layout (index.json points
// at the multi-arch index, named by the version) and returns it as a
// reproducible tar.
func ociLayoutTar(spec imageSpec, idx v1.ImageIndex) ([]byte, error) {
	dir, err := os.MkdirTemp("", "applistener-oci-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return nil, fmt.Errorf("oci layout: %w", err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": spec.Version,
		"io.containerd.image.name":          spec.Repository + ":" + spec.Version,
	})); err != nil {
		return nil, fmt.Errorf("oci layout: %w", err)
	}
	var entries []entry
	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			entries = append(entries, entry{Name: rel + "/", Mode: 0o755})
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		entries = append(entries, entry{Name: rel, Mode: 0o644, Data: b})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the oci layout: %w", err)
	}
	return reproducibleTar(entries, spec.Epoch)
}

// dockerTar is the `docker load` tarball of one platform's image, tagged
// REPOSITORY:VERSION.
func dockerTar(spec imageSpec, img v1.Image) ([]byte, error) {
	tag, err := name.NewTag(spec.Repository + ":" + spec.Version)
	if err != nil {
		return nil, fmt.Errorf("image tag: %w", err)
	}
	var buf bytes.Buffer
	if err := tarball.Write(tag, img, &buf); err != nil {
		return nil, fmt.Errorf("docker tarball: %w", err)
	}
	return buf.Bytes(), nil
}

// platformOf parses "linux_amd64" or "linux_arm64".
func platformOf(s string) v1.Platform {
	osName, arch, _ := strings.Cut(s, "_")
	return v1.Platform{OS: osName, Architecture: arch}
}
