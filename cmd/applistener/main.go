// Command applistener is the sandbox application listener: a TLS listener
// that routes each connection by SNI to one sandbox instance's loopback
// app, with routes that are valid only while the control plane keeps them
// fresh.
//
//	applistener serve      the supervisor's listener
//	applistener gateway    the reference gateway
//	applistener routes     read the gateway's discovery (get, watch); print a hostname (hostname)
//	applistener edge       an SNI pass-through front door fed by discovery
//	applistener instances  put, delete or list instances (the gateway's admin API)
//	applistener supervisors list or forget supervisors (the gateway's admin API)
//	applistener access     mint an access token for a private service (token)
//	applistener dev        a self-contained demo on loopback
//	applistener validate   check a supervisor's or gateway's configuration
//	applistener version    the build's version, revision and Go version
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// errUsage marks a command-line error: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

const topUsage = `usage: applistener <command> [flags]

commands:
  serve      run the application listener of a supervisor
  gateway    run the reference gateway (configuration for supervisors, discovery)
  routes     read a workspace's published routes (get, watch); print a service's hostname (hostname)
  edge       run an SNI pass-through front door that follows discovery
  instances  put, delete or list a supervisor's instances (the gateway's admin API)
  supervisors list the supervisors the gateway knows, or forget one (the gateway's admin API)
  access     print an access token for a private service (token)
  dev        run a self-contained demo (certificate, app and route) on loopback
  validate   check serve's flags and files (validate gateway ...: the gateway's) without starting
  version    print the version, VCS revision and Go version
  completion print a shell completion script: bash, zsh or fish

Run 'applistener <command> -h' for the flags of a command; --version on any
command prints the version. Every flag can also be set from the environment
as APPLISTENER_<FLAG> (--app-domain: APPLISTENER_APP_DOMAIN); a flag on the
command line wins. docs/cli.md lists every command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	warnings, helpOut = stderr, stdout
	if len(args) == 0 {
		_, _ = fmt.Fprint(stderr, topUsage)
		return 2
	}
	if args[0] != "version" && wantsVersion(args[1:]) {
		_, _ = fmt.Fprintln(stdout, readBuildInfo())
		return 0
	}
	var err error
	switch args[0] {
	case "version", "--version", "-version":
		err = versionCommand(args[1:], stdout)
	case "validate":
		err = validateCommand(args[1:], stdout)
	case "serve":
		err = serveCommand(args[1:], stderr)
	case "dev":
		err = devCommand(args[1:], stdout, stderr)
	case "gateway":
		err = gatewayCommand(args[1:], stderr)
	case "routes":
		err = routesCommand(args[1:], stdout, stderr)
	case "edge":
		err = edgeCommand(args[1:], stderr)
	case "instances":
		err = instancesCommand(args[1:], os.Stdin, stdout, stderr)
	case "supervisors":
		err = supervisorsCommand(args[1:], stdout, stderr)
	case "access":
		err = accessCommand(args[1:], stdout, stderr)
	case "completion":
		err = completionCommand(args[1:], stdout)
	case "-h", "-help", "--help", "help":
		_, _ = fmt.Fprint(stdout, topUsage)
		return 0
	default:
		_, _ = fmt.Fprintf(stderr, "applistener: unknown command %q\n%s", args[0], topUsage)
		return 2
	}
	return exitCode(args[0], err, stderr)
}

// exitCode reports err of command name on stderr and returns the process's
// exit code: 0 done (or -h), 2 a usage error, 1 any other failure.
func exitCode(name string, err error, stderr io.Writer) int {
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		_, _ = fmt.Fprintf(stderr, "applistener %s: %s\n", name, ue.msg)
		return 2
	default:
		_, _ = fmt.Fprintf(stderr, "applistener %s: %v\n", name, err)
		return 1
	}
}

// commandOptions are a subcommand's settings: its flags and their checks.
type commandOptions interface {
	flags(fs *flag.FlagSet)
	validate() error
}

// parseCommand parses args into o (flags of the subcommand name) and
// validates them; errors are one-line usage errors.
func parseCommand(name string, args []string, o commandOptions) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	o.flags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	return o.validate()
}
