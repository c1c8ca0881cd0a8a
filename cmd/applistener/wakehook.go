package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/applistener/applistener/control/supervisor"
	"github.com/applistener/applistener/wake"
)

// wakeHookFlags are --wake-hook and --wake-hook-token-file, shared by
// serve (a routes-file deployment) and gateway.
type wakeHookFlags struct {
	url       string
	tokenFile string
}

func (f *wakeHookFlags) flags(fs *flag.FlagSet, who, empty string) {
	fs.StringVar(&f.url, "wake-hook", "", "URL of the platform's wake hook: "+who+` POSTs {"workspace","sandbox","generation","supervisor"} there to wake a sleeping instance (2xx accepted, 409/422 cannot be woken); empty: `+empty)
	fs.StringVar(&f.tokenFile, "wake-hook-token-file", "", "file holding a bearer token sent to the wake hook (read at start; needs https unless the hook is on loopback)")
}

// validate checks the flags.
func (f *wakeHookFlags) validate() error {
	if f.url == "" {
		if f.tokenFile != "" {
			return usagef("--wake-hook-token-file requires --wake-hook")
		}
		return nil
	}
	if err := wake.CheckHookURL(f.url); err != nil {
		return usagef("--wake-hook: %v", err)
	}
	if f.tokenFile != "" {
		u, _ := url.Parse(f.url)
		if u.Scheme != "https" && !isLoopbackHost(u.Hostname()) {
			return usagef("--wake-hook-token-file: the token would be sent in clear text to %s (use an https hook)", u.Host)
		}
	}
	return nil
}

// options returns the hook's options (nil without --wake-hook), reading
// the token file.
func (f *wakeHookFlags) options(supervisor string) (*wake.HookOptions, error) {
	if f.url == "" {
		return nil, nil
	}
	opts := &wake.HookOptions{URL: f.url, Supervisor: supervisor}
	if f.tokenFile != "" {
		b, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--wake-hook-token-file: %w", err)
		}
		if opts.Token = strings.TrimSpace(string(b)); opts.Token == "" {
			return nil, fmt.Errorf("--wake-hook-token-file %s is empty", f.tokenFile)
		}
	}
	return opts, nil
}

// newWakeCoordinator returns the supervisor's wake coordinator: it asks
// the gateway (gw not nil) or the --wake-hook of a routes-file deployment;
// nil when neither can wake anything. The caller closes it.
func newWakeCoordinator(o *serveOptions, gw *supervisor.GatewayClient, reg prometheus.Registerer, logger *slog.Logger) (*wake.Coordinator, error) {
	var waker wake.Waker
	switch {
	case gw != nil:
		waker = gw
	case o.wakeHook.url != "":
		sup := o.supervisorID
		if sup == "" {
			sup, _ = os.Hostname() // a routes-file deployment: the host names it
		}
		opts, err := o.wakeHook.options(sup)
		if err != nil {
			return nil, err
		}
		hook, err := wake.NewHook(*opts)
		if err != nil {
			return nil, err
		}
		waker = hook
	default:
		return nil, nil
	}
	c, err := wake.New(wake.Options{Waker: waker, Registerer: reg, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("wake coordinator: %w", err)
	}
	return c, nil
}
