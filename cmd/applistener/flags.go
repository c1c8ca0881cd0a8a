package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// warnings receives warnings about the command line (deprecated flag
// names) and helpOut the -h text; run points them at the process's stderr
// and stdout.
var (
	warnings io.Writer = os.Stderr
	helpOut  io.Writer = os.Stdout
)

// envPrefix starts the environment variable of every flag:
// APPLISTENER_APP_DOMAIN is --app-domain.
const envPrefix = "APPLISTENER_"

// deprecatedPrefix starts the usage of a deprecated flag name.
const deprecatedPrefix = "deprecated: use --"

// envName is the environment variable of flag name.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// deprecatedAlias adds old as another name of fs's flag name (defined
// before): the same value, a warning when used. Old names are kept for one
// release.
func deprecatedAlias(fs *flag.FlagSet, old, name string) {
	f := fs.Lookup(name)
	if f == nil {
		panic("deprecatedAlias: no flag --" + name) // a programming error, caught by every test of the command
	}
	fs.Var(f.Value, old, deprecatedPrefix+name)
}

// isDeprecated reports whether f is a deprecated alias, and of which flag.
func isDeprecated(f *flag.Flag) (string, bool) {
	return strings.CutPrefix(f.Usage, deprecatedPrefix)
}

// parseFlags parses args into fs: flags first, then for each flag not on
// the command line its APPLISTENER_ environment variable. Errors are
// one-line usage errors, an unknown flag with the nearest known name; -h
// prints the usage line and the flags on stdout.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(helpOut, fs)
			return err
		}
		return usagef("%s (see -h)", flagError(fs, err))
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q (see -h)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		set[f.Name] = true
		if name, ok := isDeprecated(f); ok {
			set[name] = true
			_, _ = fmt.Fprintf(warnings, "applistener %s: warning: --%s is deprecated and will be removed; use --%s\n", fs.Name(), f.Name, name)
		}
	})
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if _, dep := isDeprecated(f); dep || set[f.Name] || envErr != nil {
			return
		}
		v, ok := os.LookupEnv(envName(f.Name))
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			envErr = usagef("%s=%q: invalid value for --%s: %v", envName(f.Name), v, f.Name, unwrapFlagErr(err))
		}
	})
	return envErr
}

// printUsage writes the usage line and every flag but the deprecated
// aliases, with their environment variables.
func printUsage(w io.Writer, fs *flag.FlagSet) {
	_, _ = fmt.Fprintf(w, "usage: applistener %s [flags]\n\nflags (each also from the environment variable shown):\n", fs.Name())
	fs.VisitAll(func(f *flag.Flag) {
		if _, dep := isDeprecated(f); dep {
			return
		}
		arg, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if arg != "" {
			line += " " + arg
		}
		_, _ = fmt.Fprintf(w, "%s\t%s\n    \t%s", line, envName(f.Name), strings.ReplaceAll(usage, "\n", "\n    \t"))
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			_, _ = fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		_, _ = fmt.Fprintln(w)
	})
}

// flagError rewrites the flag package's errors in the project's words: an
// unknown flag with the nearest known name.
func flagError(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		name = strings.TrimPrefix(name, "-")
		if near := nearestFlag(fs, name); near != "" {
			return fmt.Sprintf("unknown flag --%s (did you mean --%s?)", name, near)
		}
		return "unknown flag --" + name
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return "--" + strings.TrimPrefix(name, "-") + " needs a value"
	}
	// "invalid boolean value "x" for -n: parse error"
	if rest, ok := strings.CutPrefix(msg, "invalid boolean value "); ok {
		if v, after, ok := strings.Cut(rest, " for -"); ok {
			name, _, _ := strings.Cut(after, ": ")
			return fmt.Sprintf("--%s %s: not true or false (a boolean flag is given alone, or as --%s=false)", strings.TrimPrefix(name, "-"), v, strings.TrimPrefix(name, "-"))
		}
	}
	// "invalid value "x" for flag -n: parse error"
	if rest, ok := strings.CutPrefix(msg, "invalid value "); ok {
		if v, after, ok := strings.Cut(rest, " for flag -"); ok {
			name, why, _ := strings.Cut(after, ": ")
			return fmt.Sprintf("--%s %s: %s", strings.TrimPrefix(name, "-"), v, plainParseError(why))
		}
	}
	return msg
}

// unwrapFlagErr is the reason of a flag.Value's Set error in plain words.
func unwrapFlagErr(err error) string { return plainParseError(err.Error()) }

// plainParseError replaces strconv's "parse error" and "invalid syntax"
// with what was expected.
func plainParseError(why string) string {
	switch why {
	case "parse error", "invalid syntax":
		return "not a valid value (a number, a duration like 10s, or true/false as the flag takes)"
	case "value out of range":
		return "out of range"
	}
	return why
}

// nearestFlag is the flag name closest to name (edit distance at most 2,
// or name a prefix of it), "" when none is near.
func nearestFlag(fs *flag.FlagSet, name string) string {
	best, bestD := "", 3
	fs.VisitAll(func(f *flag.Flag) {
		if _, dep := isDeprecated(f); dep {
			return
		}
		d := editDistance(name, f.Name)
		if strings.HasPrefix(f.Name, name) && len(name) >= 3 {
			d = min(d, 1)
		}
		if d < bestD {
			best, bestD = f.Name, d
		}
	})
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// derivedDuration is a duration flag whose default is derived in validate
// from other flags: given records whether it was set, on the command line
// or from its environment variable, so that an explicit value is checked as
// given and an absent one is computed.
type derivedDuration struct {
	d     time.Duration
	given bool
}

// derivedDurationVar defines v as flag name; def describes the derived
// default in the usage and the CLI reference.
func derivedDurationVar(fs *flag.FlagSet, v *derivedDuration, name, def, usage string) {
	fs.Var(v, name, usage)
	fs.Lookup(name).DefValue = def
}

// String is the value given, "" when none was.
func (v *derivedDuration) String() string {
	if v == nil || !v.given {
		return ""
	}
	return v.d.String()
}

// Set parses s as a duration and marks the flag given.
func (v *derivedDuration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("parse error")
	}
	v.d, v.given = d, true
	return nil
}
