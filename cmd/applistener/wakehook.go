package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

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

// newWakeCoordinator returns the supervisor's wake coordinator and the
// path its wakes take: the --wake-hook of a routes-file deployment at
// once, or the gateway client, which the caller sets once it exists. It
// returns nil (sleeping instances are not woken) for a routes file without
// --wake-hook. The caller closes the coordinator.
func newWakeCoordinator(o *serveOptions, reg prometheus.Registerer, logger *slog.Logger) (*wake.Coordinator, *wakePath, error) {
	path := &wakePath{}
	switch {
	case o.gatewayEndpoint != "":
	case o.wakeHook.url != "":
		sup := o.supervisorID
		if sup == "" {
			sup, _ = os.Hostname() // a routes-file deployment: the host names it
		}
		opts, err := o.wakeHook.options(sup)
		if err != nil {
			return nil, nil, err
		}
		hook, err := wake.NewHook(*opts)
		if err != nil {
			return nil, nil, err
		}
		path.set(hook)
	default:
		return nil, path, nil
	}
	c, err := wake.New(wake.Options{Waker: path, Registerer: reg, Logger: logger})
	if err != nil {
		return nil, nil, fmt.Errorf("wake coordinator: %w", err)
	}
	return c, path, nil
}

// wakePath is the Waker of the supervisor's coordinator: the hook, or the
// gateway client once it exists.
type wakePath struct {
	mu sync.Mutex
	w  wake.Waker
}

// set makes w the path of the wakes.
func (p *wakePath) set(w wake.Waker) {
	p.mu.Lock()
	p.w = w
	p.mu.Unlock()
}

// Wake asks through the path set, or fails when none is.
func (p *wakePath) Wake(ctx context.Context, key wake.Key) error {
	p.mu.Lock()
	w := p.w
	p.mu.Unlock()
	if w == nil {
		return errors.New("no wake path configured")
	}
	return w.Wake(ctx, key)
}
