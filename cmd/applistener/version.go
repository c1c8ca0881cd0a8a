package main

import (
	"cmp"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"slices"
)

// version is stamped by the build: go build -ldflags "-X main.version=v1.2.3"
// (the Makefile and the Dockerfile set it from git describe). Unstamped
// builds report the module version from the build information instead.
var version string

// revision is stamped by release builds (make release), which build with
// -buildvcs=false so that the Dockerfile, which has no .git, produces the
// same binary: -ldflags "-X main.revision=<commit>". The VCS revision of the
// build information takes precedence when there is one.
var revision string

// buildInfo is what `applistener version` reports.
type buildInfo struct {
	Version   string // the stamped version, else the module version, else "devel"
	Module    string // the main module's version ("(devel)" for a local build)
	Revision  string // VCS revision, "" when unknown
	Modified  bool   // the working tree had changes
	GoVersion string
}

// readBuildInfo combines the stamped version with runtime/debug's build
// information.
func readBuildInfo() buildInfo {
	b := buildInfo{GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		b.Module = bi.Main.Version
		b.GoVersion = cmp.Or(bi.GoVersion, b.GoVersion)
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Revision = s.Value
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	b.Revision = cmp.Or(b.Revision, revision)
	b.Version = version
	if b.Version == "" && b.Module != "" && b.Module != "(devel)" {
		b.Version = b.Module
	}
	b.Version = cmp.Or(b.Version, "devel")
	return b
}

// String is the one line `applistener version` and --version print.
func (b buildInfo) String() string {
	return fmt.Sprintf("applistener %s module=%s revision=%s modified=%t go=%s",
		b.Version, cmp.Or(b.Module, "unknown"), cmp.Or(b.Revision, "unknown"), b.Modified, b.GoVersion)
}

// wantsVersion reports whether a subcommand's arguments ask for the version
// (--version or -version before a "--").
func wantsVersion(args []string) bool {
	end := slices.Index(args, "--")
	if end < 0 {
		end = len(args)
	}
	return slices.ContainsFunc(args[:end], func(a string) bool { return a == "--version" || a == "-version" })
}

func versionCommand(args []string, stdout io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help", "help":
			_, err := fmt.Fprint(stdout, "usage: applistener version\n\nPrints the version, module version, VCS revision and Go version (also --version after any command).\n")
			return err
		}
		return usagef("unexpected argument %q", args[0])
	}
	_, err := fmt.Fprintln(stdout, readBuildInfo())
	return err
}
