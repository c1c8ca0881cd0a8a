package main

import (
	"errors"
	"testing"

	"github.com/applistener/applistener/dispatch"
)

// TestServeAccessLogFlags: the access log is on (text, 100 lines/s per
// instance, 10,000 lines/s in all) unless turned off, and may be OCSF records; an unknown format
// or OCSF level is a usage error.
func TestServeAccessLogFlags(t *testing.T) {
	base := []string{"--routes-file", "routes.json"}
	for _, c := range []struct {
		args       []string
		format     string
		rate       float64
		total      float64
		usageError bool
	}{
		{nil, dispatch.AccessLogText, dispatch.DefaultAccessLogRate, dispatch.DefaultAccessLogTotalRate, false},
		{[]string{"--access-log=json", "--access-log-rate=5"}, dispatch.AccessLogJSON, 5, dispatch.DefaultAccessLogTotalRate, false},
		{[]string{"--access-log-total-rate=500"}, dispatch.AccessLogText, dispatch.DefaultAccessLogRate, 500, false},
		{[]string{"--access-log-total-rate=-1"}, dispatch.AccessLogText, dispatch.DefaultAccessLogRate, -1, false},
		{[]string{"--access-log=off"}, dispatch.AccessLogOff, dispatch.DefaultAccessLogRate, dispatch.DefaultAccessLogTotalRate, false},
		{[]string{"--access-log=ocsf"}, dispatch.AccessLogOCSF, dispatch.DefaultAccessLogRate, dispatch.DefaultAccessLogTotalRate, false},
		{[]string{"--access-log=xml"}, "", 0, 0, true},
		{[]string{"--ocsf-json", "--ocsf-level=loud"}, "", 0, 0, true},
	} {
		var o serveOptions
		err := parseCommand("serve", append(append([]string{}, base...), c.args...), &o)
		var ue *usageError
		if c.usageError {
			if !errors.As(err, &ue) {
				t.Errorf("%v: err %v, want a usage error", c.args, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", c.args, err)
			continue
		}
		if o.accessLog != c.format || o.accessLogRate != c.rate || o.accessLogTotal != c.total {
			t.Errorf("%v: access log %q rate %v total %v, want %q %v %v", c.args, o.accessLog, o.accessLogRate, o.accessLogTotal, c.format, c.rate, c.total)
		}
	}
	// A struct built without flags (applistener dev) gets the default.
	o := serveOptions{mode: "shared", healthAddress: "127.0.0.1:0", routesFile: "routes.json", logFormat: "text", logLevel: "info", freshness: 30e9, maxHeaderBytes: 16 << 10}
	if err := o.validate(); err != nil || o.accessLog != dispatch.AccessLogText {
		t.Errorf("zero options: %v, access log %q", err, o.accessLog)
	}
}
