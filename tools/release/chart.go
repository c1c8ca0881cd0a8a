package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// helmIgnored reads a chart's .helmignore: blank lines and comments are
// skipped; the chart's patterns are base-name globs, which is all this
// supports (a pattern with a "/" is refused rather than misread).
func helmIgnored(chartDir string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(chartDir, ".helmignore"))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var pats []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.ContainsAny(l, "/!") {
			return nil, fmt.Errorf(".helmignore pattern %q: only base-name globs are supported", l)
		}
		pats = append(pats, l)
	}
	return pats, sc.Err()
}

var (
	chartVersionLine    = regexp.MustCompile(`(?m)^version: .*$`)
	chartAppVersionLine = regexp.MustCompile(`(?m)^appVersion: .*$`)
	valuesDigestLine    = regexp.MustCompile(`(?m)^  digest: ""$`)
)

// replaceOnce replaces the single match of re in b, failing when there is
// not exactly one.
func replaceOnce(b []byte, re *regexp.Regexp, with, what string) ([]byte, error) {
	if n := len(re.FindAll(b, -1)); n != 1 {
		return nil, fmt.Errorf("%s: %d lines match %s, want 1", what, n, re)
	}
	return re.ReplaceAllLiteral(b, []byte(with)), nil
}

// packageChart is `helm package` made reproducible: the chart directory as
// NAME/... entries, Chart.yaml's version and appVersion set to the release
// version, values.yaml's image.digest set to the image index's digest.
func packageChart(chartDir, version, digest string, epoch time.Time) ([]byte, string, error) {
	ignored, err := helmIgnored(chartDir)
	if err != nil {
		return nil, "", err
	}
	chartName := filepath.Base(chartDir)
	var entries []entry
	err = filepath.WalkDir(chartDir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(chartDir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		for _, pat := range ignored {
			if ok, _ := path.Match(pat, d.Name()); ok {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
		}
		if d.IsDir() {
			entries = append(entries, entry{Name: chartName + "/" + rel + "/", Mode: 0o755})
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		switch rel {
		case "Chart.yaml":
			if b, err = replaceOnce(b, chartVersionLine, "version: "+version, rel); err != nil {
				return err
			}
			if b, err = replaceOnce(b, chartAppVersionLine, fmt.Sprintf("appVersion: %q", version), rel); err != nil {
				return err
			}
		case "values.yaml":
			if b, err = replaceOnce(b, valuesDigestLine, fmt.Sprintf("  digest: %q", digest), rel+" (image.digest)"); err != nil {
				return err
			}
		}
		entries = append(entries, entry{Name: chartName + "/" + rel, Mode: 0o644, Data: b})
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("packaging %s: %w", chartDir, err)
	}
	t, err := reproducibleTar(entries, epoch)
	if err != nil {
		return nil, "", err
	}
	gz, err := gzipBytes(t)
	return gz, fmt.Sprintf("%s-%s.tgz", chartName, version), err
}
