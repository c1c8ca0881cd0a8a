// Package h2xconnect turns on golang.org/x/net/http2's server support for
// the extended CONNECT method (RFC 8441, WebSockets over HTTP/2) by adding
// http2xconnect=1 to the GODEBUG environment variable before that package
// reads it. Import it for its side effect, from any package of the program:
//
//	import _ "github.com/applistener/applistener/internal/h2xconnect"
//
// x/net/http2 keeps extended CONNECT off unless GODEBUG contains
// http2xconnect=1, and it reads GODEBUG once, in its package init
// (golang/go#71128); there is no per-server option. An environment
// variable set by main would come too late, and asking every operator to
// export GODEBUG would make the feature depend on how the process is
// started.
//
// Why this package's init runs before x/net/http2's: the Go specification
// (section "Program initialization") fixes the order: "Given the list of
// all packages, sorted by import path, in each step the first
// uninitialized package in the list for which all imports (if any) are
// already initialized is initialized." (Go 1.21 and later.) This package
// imports only os, strings and net/http, and x/net/http2 imports all three
// itself, so whenever x/net/http2 is ready to be initialized this package
// is too; its import path, github.com/applistener/applistener/..., sorts
// before golang.org/x/net/http2 ('i' < 'o'), so it is picked first. Where
// it is imported from does not matter. Renaming the module to a path that
// sorts after golang.org would break the argument: the tests (this
// package's, dispatch's, and the end-to-end test that reads the built
// binary's SETTINGS frame) would catch it.
//
// Why it imports net/http: net/http carries its own copy of the HTTP/2
// server (h2_bundle.go) with the same GODEBUG check in its init. Importing
// net/http makes that init run before this one, so the standard library's
// servers (the admin endpoints, the gateway) keep extended CONNECT off:
// only the x/net server that dispatch drives, which answers extended
// CONNECT itself, advertises it.
package h2xconnect

import (
	// Initialised before this package (see the package doc): net/http's
	// bundled HTTP/2 server has read GODEBUG before it is changed.
	_ "net/http"
	"os"
	"strings"
)

// Setting is the GODEBUG entry this package adds.
const Setting = "http2xconnect=1"

// Enabled reports whether GODEBUG carried Setting once this package was
// initialised, which is what x/net/http2's init then saw.
func Enabled() bool { return enabled }

var enabled bool

func init() {
	enabled = apply()
}

// apply adds Setting to GODEBUG unless it is there already; it reports
// whether GODEBUG holds it afterwards.
func apply() bool {
	v := os.Getenv("GODEBUG")
	if strings.Contains(v, Setting) {
		return true
	}
	if v != "" {
		v += ","
	}
	return os.Setenv("GODEBUG", v+Setting) == nil
}
