package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestGatewayPollIntervalDerivedFromFreshness: without
// --gateway-poll-interval, serve polls three times per --route-freshness
// (at most every 10 s), so a short freshness alone starts; a poll interval
// given on the command line or in the environment is checked as given and
// refused with the same message when it cannot keep the routes fresh.
func TestGatewayPollIntervalDerivedFromFreshness(t *testing.T) {
	base := []string{"--gateway", "http://127.0.0.1:1", "--supervisor-id", "s1"}
	for _, c := range []struct {
		name string
		env  string // APPLISTENER_GATEWAY_POLL_INTERVAL, "" unset
		args []string
		want time.Duration // 0: a usage error
	}{
		{name: "default freshness", want: 10 * time.Second},
		{name: "short freshness", args: []string{"--route-freshness", "3s"}, want: time.Second},
		{name: "odd freshness", args: []string{"--route-freshness", "1001ms"}, want: 333 * time.Millisecond},
		{name: "long freshness", args: []string{"--route-freshness", "2m"}, want: 10 * time.Second},
		{name: "explicit, shorter", args: []string{"--route-freshness", "3s", "--gateway-poll-interval", "2s"}, want: 2 * time.Second},
		{name: "explicit, too long", args: []string{"--route-freshness", "3s", "--gateway-poll-interval", "10s"}},
		{name: "explicit default, too long", args: []string{"--route-freshness", "10s", "--gateway-poll-interval", "10s"}},
		{name: "explicit zero", args: []string{"--gateway-poll-interval", "0"}},
		{name: "explicit negative", args: []string{"--gateway-poll-interval=-1s"}},
		{name: "environment, too long", env: "5s", args: []string{"--route-freshness", "3s"}},
		{name: "environment, shorter", env: "500ms", args: []string{"--route-freshness", "3s"}, want: 500 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env != "" {
				t.Setenv("APPLISTENER_GATEWAY_POLL_INTERVAL", c.env)
			}
			var o serveOptions
			err := parseCommand("serve", append(append([]string{}, base...), c.args...), &o)
			if c.want == 0 {
				if err == nil || !strings.Contains(err.Error(), "--gateway-poll-interval must be positive and shorter than --route-freshness") {
					t.Fatalf("%q: err %v, want the poll interval refused", c.args, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("%q: %v", c.args, err)
			}
			if o.gatewayPoll.d != c.want {
				t.Errorf("%q: poll interval %v, want %v", c.args, o.gatewayPoll.d, c.want)
			}
		})
	}

	// The command line: an explicit value the freshness cannot keep is
	// exit 2 with the message; -h names the derived default.
	var stdout, stderr bytes.Buffer
	if code := run(append([]string{"serve", "--route-freshness", "3s", "--gateway-poll-interval", "3s"}, base...), &stdout, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "--gateway-poll-interval must be positive and shorter than --route-freshness") {
		t.Errorf("explicit 3s with a 3s freshness: exit %d, stderr %q", code, stderr.String())
	}
	stdout.Reset()
	if code := run([]string{"serve", "-h"}, &stdout, &stderr); code != 0 ||
		!strings.Contains(stdout.String(), "poll interval while the push session is down (default a third of --route-freshness, at most 10s)") {
		t.Errorf("serve -h: exit %d, the poll interval's default not described:\n%s", code, stdout.String())
	}
}
