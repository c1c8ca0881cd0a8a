// Command release assembles and checks applistener's release artefacts.
//
//	release assemble -version 1.2.3 -commit SHA -epoch UNIX -bins DIR -dist DIR -root REPO
//	release check    -version 1.2.3 -dist DIR -helm HELM
//
// The Makefile builds the binaries (make release) and calls it; see
// README.md "Install" and SECURITY.md for what the artefacts are.
package main

import (
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// archivePlatforms get a tar.gz; imagePlatforms (a subset) go into the image.
var (
	archivePlatforms = []string{"linux_amd64", "linux_arm64", "darwin_arm64"}
	imagePlatforms   = []string{"linux_amd64", "linux_arm64"}
)

// semver is the VERSION a release accepts: x.y.z with an optional
// pre-release, no leading "v" (the tag is vx.y.z).
var semver = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: release assemble|check [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "assemble":
		err = assembleCommand(os.Args[2:])
	case "check":
		err = checkCommand(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (assemble or check)", os.Args[1])
	}
	if err != nil {
		slog.Error("release", "command", os.Args[1], "error", err)
		os.Exit(1)
	}
}

type assembleFlags struct {
	version, commit, bins, dist, root, repository, source string
	epoch                                                 int64
}

func assembleCommand(args []string) error {
	var f assembleFlags
	fs := flag.NewFlagSet("assemble", flag.ContinueOnError)
	fs.StringVar(&f.version, "version", "", "release version x.y.z")
	fs.StringVar(&f.commit, "commit", "", "the commit released (full hash)")
	fs.Int64Var(&f.epoch, "epoch", -1, "SOURCE_DATE_EPOCH: the commit time, every timestamp of the artefacts")
	fs.StringVar(&f.bins, "bins", "", "directory with applistener_OS_ARCH binaries")
	fs.StringVar(&f.dist, "dist", "", "output directory")
	fs.StringVar(&f.root, "root", ".", "repository root (LICENSE, README.md, CHANGELOG.md, deploy/helm/applistener)")
	fs.StringVar(&f.repository, "repository", "ghcr.io/applistener/applistener", "image repository the chart and the docker tarballs name")
	fs.StringVar(&f.source, "source", "https://github.com/applistener/applistener", "org.opencontainers.image.source")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !semver.MatchString(f.version) {
		return fmt.Errorf("-version %q is not x.y.z", f.version)
	}
	if f.commit == "" || f.epoch < 0 || f.bins == "" || f.dist == "" {
		return errors.New("-commit, -epoch, -bins and -dist are required")
	}
	return assemble(f)
}

func assemble(f assembleFlags) error {
	epoch := time.Unix(f.epoch, 0).UTC()
	write := func(name string, b []byte) error {
		if err := os.WriteFile(filepath.Join(f.dist, name), b, 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
		slog.Info("wrote", "file", name, "bytes", len(b))
		return nil
	}
	docs := map[string][]byte{}
	for _, n := range []string{"LICENSE", "README.md", "CHANGELOG.md"} {
		b, err := os.ReadFile(filepath.Join(f.root, n))
		if err != nil {
			return fmt.Errorf("archive document: %w", err)
		}
		docs[n] = b
	}
	binaries := map[string][]byte{}
	for _, p := range archivePlatforms {
		b, err := os.ReadFile(filepath.Join(f.bins, "applistener_"+p))
		if err != nil {
			return fmt.Errorf("binary for %s: %w", p, err)
		}
		binaries[p] = b
		dir := fmt.Sprintf("applistener_%s_%s", f.version, p)
		entries := []entry{{Name: dir + "/applistener", Mode: 0o755, Data: b}}
		for n, d := range docs {
			entries = append(entries, entry{Name: dir + "/" + n, Mode: 0o644, Data: d})
		}
		t, err := reproducibleTar(entries, epoch)
		if err != nil {
			return err
		}
		gz, err := gzipBytes(t)
		if err != nil {
			return err
		}
		if err := write(dir+".tar.gz", gz); err != nil {
			return err
		}
	}

	spec := imageSpec{Version: f.version, Commit: f.commit, Epoch: epoch, Repository: f.repository, Source: f.source}
	ca, nRoots, err := caBundle()
	if err != nil {
		return err
	}
	slog.Info("CA bundle", "roots", nRoots)
	var imgs []platformImage
	for _, p := range imagePlatforms {
		pl := platformOf(p)
		img, err := buildImage(spec, pl, binaries[p], ca)
		if err != nil {
			return fmt.Errorf("image %s: %w", p, err)
		}
		imgs = append(imgs, platformImage{Platform: pl, Image: img})
		d, err := dockerTar(spec, img)
		if err != nil {
			return err
		}
		if err := write(fmt.Sprintf("applistener_%s_image_%s.docker.tar", f.version, p), d); err != nil {
			return err
		}
	}
	idx, err := buildIndex(spec, imgs)
	if err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return fmt.Errorf("index digest: %w", err)
	}
	oci, err := ociLayoutTar(spec, idx)
	if err != nil {
		return err
	}
	if err := write(fmt.Sprintf("applistener_%s_image_oci.tar", f.version), oci); err != nil {
		return err
	}
	chart, chartName, err := packageChart(filepath.Join(f.root, "deploy/helm/applistener"), f.version, digest.String(), epoch)
	if err != nil {
		return err
	}
	if err := write(chartName, chart); err != nil {
		return err
	}
	if err := write("IMAGE_DIGEST", []byte(f.repository+"@"+digest.String()+"\n")); err != nil {
		return err
	}
	sums, err := sha256Sums(f.dist)
	if err != nil {
		return err
	}
	return write("SHA256SUMS", sums)
}

// sha256Sums is `sha256sum` over every file of dir except SHA256SUMS and
// its signature, sorted by name.
func sha256Sums(dir string) ([]byte, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if e.Type().IsRegular() && !strings.HasPrefix(e.Name(), "SHA256SUMS") {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	var out strings.Builder
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&out, "%x  %s\n", sha256.Sum256(b), n)
	}
	return []byte(out.String()), nil
}
