package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"debug/buildinfo"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

type checkFlags struct {
	version, commit, dist, helm, repository string
	epoch                                   int64
}

func checkCommand(args []string) error {
	var f checkFlags
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.StringVar(&f.version, "version", "", "release version x.y.z")
	fs.StringVar(&f.commit, "commit", "", "the commit released (full hash), stamped into the binaries")
	fs.StringVar(&f.dist, "dist", "", "directory make release wrote")
	fs.Int64Var(&f.epoch, "epoch", -1, "SOURCE_DATE_EPOCH the release was built with")
	fs.StringVar(&f.helm, "helm", "helm", "helm executable that renders the packaged chart")
	fs.StringVar(&f.repository, "repository", "ghcr.io/applistener/applistener", "image repository")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !semver.MatchString(f.version) || f.dist == "" || f.epoch < 0 || len(f.commit) != 40 {
		return errors.New("-version x.y.z, -commit (40 hex digits), -epoch and -dist are required")
	}
	c := checker{f: f, epoch: time.Unix(f.epoch, 0).UTC()}
	for _, step := range []struct {
		name string
		run  func() error
	}{
		{"SHA256SUMS", c.sums},
		{"archives", c.archives},
		{"image", c.image},
		{"chart", c.chart},
	} {
		if err := step.run(); err != nil {
			return fmt.Errorf("%s: %w", step.name, err)
		}
		slog.Info("release check passed", "step", step.name)
	}
	return nil
}

type checker struct {
	f      checkFlags
	epoch  time.Time
	digest v1.Hash // the image index, from IMAGE_DIGEST
}

func (c *checker) path(n string) string { return filepath.Join(c.f.dist, n) }

// sums: SHA256SUMS lists every artefact, and each hash is right.
func (c *checker) sums() error {
	want, err := sha256Sums(c.f.dist)
	if err != nil {
		return err
	}
	got, err := os.ReadFile(c.path("SHA256SUMS"))
	if err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("SHA256SUMS does not match the files:\n%s\nwant:\n%s", got, want)
	}
	return nil
}

// archives: exact, sorted entries with fixed owners, modes and mtimes; the
// binary is stamped with the version and built for the archive's platform;
// the one for this machine prints the version.
func (c *checker) archives() error {
	for _, p := range archivePlatforms {
		dir := fmt.Sprintf("applistener_%s_%s", c.f.version, p)
		b, err := os.ReadFile(c.path(dir + ".tar.gz"))
		if err != nil {
			return err
		}
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
		headers, files, err := readTar(zr)
		if err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
		wantNames := []string{dir + "/", dir + "/CHANGELOG.md", dir + "/LICENSE", dir + "/README.md", dir + "/applistener"}
		slices.Sort(wantNames)
		var names []string
		for _, h := range headers {
			names = append(names, h.Name)
			if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || !h.ModTime.Equal(c.epoch) {
				return fmt.Errorf("%s: %s has owner %d:%d (%q:%q), mtime %v; want 0:0, no names, %v", dir, h.Name, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime, c.epoch)
			}
		}
		if !slices.Equal(names, wantNames) {
			return fmt.Errorf("%s: entries %q, want %q (sorted)", dir, names, wantNames)
		}
		if err := c.binary(p, dir+".tar.gz", files[dir+"/applistener"]); err != nil {
			return err
		}
	}
	return nil
}

// binary checks one binary's build information (platform, static, version
// stamped) and, when it runs here, its `version` output.
func (c *checker) binary(platform, where string, b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("%s: no applistener binary", where)
	}
	bi, err := buildinfo.Read(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("%s: build info: %w", where, err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	goos, goarch, _ := strings.Cut(platform, "_")
	if settings["GOOS"] != goos || settings["GOARCH"] != goarch || settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" {
		return fmt.Errorf("%s: built with GOOS=%s GOARCH=%s CGO_ENABLED=%s -trimpath=%s; want %s/%s, 0, true", where,
			settings["GOOS"], settings["GOARCH"], settings["CGO_ENABLED"], settings["-trimpath"], goos, goarch)
	}
	// -trimpath keeps -ldflags out of the build information, so the stamp
	// of a binary that cannot run here is looked for in its data: the
	// version and the full commit hash (40 hex digits) must both be there.
	if !bytes.Contains(b, []byte(c.f.commit)) || !bytes.Contains(b, []byte(c.f.version)) {
		return fmt.Errorf("%s: the binary does not carry version %s and commit %s", where, c.f.version, c.f.commit)
	}
	if platform != runtime.GOOS+"_"+runtime.GOARCH {
		return nil
	}
	out, err := runBinary(b, "version")
	if err != nil {
		return fmt.Errorf("%s: applistener version: %w", where, err)
	}
	if !strings.HasPrefix(out, "applistener "+c.f.version+" ") || !strings.Contains(out, "revision="+c.f.commit+" ") {
		return fmt.Errorf("%s: applistener version printed %q, want version %s and revision %s", where, out, c.f.version, c.f.commit)
	}
	slog.Info("binary runs", "from", where, "version", strings.TrimSpace(out))
	return nil
}

// runBinary writes b to a temporary file and runs it.
func runBinary(b []byte, args ...string) (string, error) {
	dir, err := os.MkdirTemp("", "applistener-check-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	exe := filepath.Join(dir, "applistener")
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, exe, args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%w: %s", err, out)
	}
	return string(out), nil
}

// image: the OCI layout holds one index (named by the version, with the
// digest the chart pins) for linux/amd64 and linux/arm64; each image
// validates, runs as 65532, and carries a binary that runs; each docker
// tarball holds the same image.
func (c *checker) image() error {
	pinned, err := os.ReadFile(c.path("IMAGE_DIGEST"))
	if err != nil {
		return err
	}
	ref, err := name.NewDigest(strings.TrimSpace(string(pinned)))
	if err != nil {
		return fmt.Errorf("IMAGE_DIGEST: %w", err)
	}
	if c.digest, err = v1.NewHash(ref.DigestStr()); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "applistener-oci-check-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ociName := fmt.Sprintf("applistener_%s_image_oci.tar", c.f.version)
	if err := untar(c.path(ociName), dir); err != nil {
		return err
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return fmt.Errorf("%s: %w", ociName, err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		return fmt.Errorf("%s: index.json: %w", ociName, err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		return err
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].Digest != c.digest || tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != c.f.version {
		return fmt.Errorf("%s: index.json lists %+v; want one index %s named %s", ociName, tm.Manifests, c.digest, c.f.version)
	}
	idx, err := top.ImageIndex(c.digest)
	if err != nil {
		return err
	}
	if err := validate.Index(idx); err != nil {
		return fmt.Errorf("%s: the index does not validate: %w", ociName, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	var platforms []string
	for _, d := range im.Manifests {
		if d.Platform == nil {
			return fmt.Errorf("%s: manifest %s has no platform", ociName, d.Digest)
		}
		pl := d.Platform.OS + "_" + d.Platform.Architecture
		platforms = append(platforms, pl)
		img, err := idx.Image(d.Digest)
		if err != nil {
			return err
		}
		if err := c.oneImage(pl, ociName+" "+pl, img); err != nil {
			return err
		}
		if err := c.dockerTarball(pl, img); err != nil {
			return err
		}
	}
	if !slices.Equal(platforms, imagePlatforms) {
		return fmt.Errorf("%s: platforms %q, want %q", ociName, platforms, imagePlatforms)
	}
	return nil
}

func (c *checker) oneImage(platform, where string, img v1.Image) error {
	if err := validate.Image(img); err != nil {
		return fmt.Errorf("%s: does not validate: %w", where, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	if cf.OS+"_"+cf.Architecture != platform {
		return fmt.Errorf("%s: config says %s/%s", where, cf.OS, cf.Architecture)
	}
	if cf.Config.User != imageUserStr {
		return fmt.Errorf("%s: config user %q, want %s (non-root)", where, cf.Config.User, imageUserStr)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/" + imageBinary}) {
		return fmt.Errorf("%s: entrypoint %q", where, cf.Config.Entrypoint)
	}
	if cf.Config.Labels["org.opencontainers.image.version"] != c.f.version || !cf.Created.Time.Equal(c.epoch) {
		return fmt.Errorf("%s: version label %q, created %v; want %s, %v", where, cf.Config.Labels["org.opencontainers.image.version"], cf.Created.Time, c.f.version, c.epoch)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	headers, files, err := readTar(rc)
	if err != nil {
		return fmt.Errorf("%s: filesystem: %w", where, err)
	}
	if h := headerByName(headers, imageBinary); h == nil || h.Uid != 0 || h.Mode != 0o755 {
		return fmt.Errorf("%s: %s missing or not root-owned 0755", where, imageBinary)
	}
	if !bytes.Contains(files["etc/passwd"], []byte("nonroot:x:65532:65532:")) || !bytes.Contains(files["etc/group"], []byte("nonroot:x:65532:")) {
		return fmt.Errorf("%s: /etc/passwd or /etc/group does not name uid/gid 65532", where)
	}
	if n := bytes.Count(files[imageCAFile], []byte("BEGIN CERTIFICATE")); n < 50 {
		return fmt.Errorf("%s: the CA bundle holds %d certificates", where, n)
	}
	return c.binary(platform, where, files[imageBinary])
}

// dockerTarball: the `docker load` tarball of a platform has the same
// config (so the same image id) as the index's image, and validates.
func (c *checker) dockerTarball(platform string, want v1.Image) error {
	n := fmt.Sprintf("applistener_%s_image_%s.docker.tar", c.f.version, platform)
	tag, err := name.NewTag(c.f.repository + ":" + c.f.version)
	if err != nil {
		return err
	}
	img, err := tarball.ImageFromPath(c.path(n), &tag)
	if err != nil {
		return fmt.Errorf("%s: %w", n, err)
	}
	if err := validate.Image(img); err != nil {
		return fmt.Errorf("%s: does not validate: %w", n, err)
	}
	got, err := img.ConfigName()
	if err != nil {
		return err
	}
	w, err := want.ConfigName()
	if err != nil {
		return err
	}
	if got != w {
		return fmt.Errorf("%s: config %s, the OCI index's %s image has %s", n, got, platform, w)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	if cf.Config.User != imageUserStr {
		return fmt.Errorf("%s: user %q", n, cf.Config.User)
	}
	return nil
}

// chart: the packaged chart says version and appVersion x.y.z and renders
// the image pinned by the index digest.
func (c *checker) chart() error {
	n := fmt.Sprintf("applistener-%s.tgz", c.f.version)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, c.f.helm, "show", "chart", c.path(n)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("helm show chart %s: %w: %s", n, err, out)
	}
	if !bytes.Contains(out, []byte("\nversion: "+c.f.version+"\n")) || !bytes.Contains(out, []byte("appVersion: "+c.f.version+"\n")) {
		return fmt.Errorf("%s: Chart.yaml does not say version and appVersion %s:\n%s", n, c.f.version, out)
	}
	out, err = exec.CommandContext(ctx, c.f.helm, "template", "rel", c.path(n), "--namespace", "sbx",
		"--set", "controlPlane.gatewayEndpoint=https://gateway.control.svc:8080",
		"--set", "controlPlane.token.secretName=applistener-gateway-token").CombinedOutput()
	if err != nil {
		return fmt.Errorf("helm template %s: %w: %s", n, err, out)
	}
	want := fmt.Sprintf("image: %q", c.f.repository+"@"+c.digest.String())
	var images []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); strings.HasPrefix(l, "image: ") {
			images = append(images, l)
		}
	}
	if len(images) == 0 || slices.ContainsFunc(images, func(l string) bool { return l != want }) {
		return fmt.Errorf("%s renders images %q, want every one %s", n, images, want)
	}
	slog.Info("chart pins the image", "chart", n, "image", want, "containers", len(images))
	return nil
}

// untar extracts a tar file's regular files and directories into dir.
func untar(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	_, files, err := readTar(f)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	for n, b := range files {
		p := filepath.Join(dir, filepath.FromSlash(n))
		if !strings.HasPrefix(p, filepath.Clean(dir)+string(filepath.Separator)) {
			return fmt.Errorf("%s: entry %q leaves the directory", file, n)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
