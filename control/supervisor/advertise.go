package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/internal/panicguard"
	"github.com/applistener/applistener/routes"
)

// Installations lists the table's usable routes with the endpoint they are
// reached at.
func Installations(t *routes.Table, endpoint api.AdvertisedEndpoint) api.InstallationSet {
	set := api.InstallationSet{Installations: []api.AdvertisedRoute{}}
	if !t.Fresh() {
		return set
	}
	for _, r := range t.Snapshot().Routes() {
		if !r.Usable() {
			continue
		}
		set.Installations = append(set.Installations, api.AdvertisedRoute{
			Hostname:            r.Host,
			Workspace:           r.Workspace,
			Sandbox:             r.Sandbox,
			Name:                r.Service,
			InstallationVersion: r.InstallationVersion,
			DeclarationRevision: r.DeclarationRevision(),
			ExpiresAt:           r.FreshUntil().UTC().Truncate(time.Millisecond),
			Endpoint:            endpoint,
			Generation:          r.Generation,
			Protocol:            r.Protocol,
			Access:              advertisedAccess(r),
		})
	}
	return set
}

// advertisedAccess is the access mode a route is advertised with: "token"
// for a private service, "" for a public one.
func advertisedAccess(r *routes.Route) string {
	if r.Access.IsPublic() {
		return ""
	}
	return r.Access.Mode
}

// InstallationsHandler serves the installed routes read-only (for the admin
// address).
func InstallationsHandler(t *routes.Table, endpoint api.AdvertisedEndpoint) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(Installations(t, endpoint))
	})
}

// Advertiser tells the gateway which routes this supervisor has installed:
// after every change and at every renewal of the table it PUTs the complete
// set, bound to the client's session. Failures are retried with backoff; a
// newer change replaces a pending retry. It uses the client's current
// gateway endpoint and moves to the next one on a connection error or a
// 5xx, as the session does.
type Advertiser struct {
	Client   *GatewayClient // for the endpoints, id, session, token and HTTP client
	Table    *routes.Table
	Endpoint api.AdvertisedEndpoint
	Logger   *slog.Logger
}

// Run advertises until ctx ends. The client must be initialised (Init).
func (a *Advertiser) Run(ctx context.Context) {
	changes := a.Table.Subscribe()
	backoff := a.Client.newBackoff()
	var retry <-chan time.Time
	var lastSent []byte
	var lastSentTo string
	var lastSentAt time.Time
	lastErr := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-changes:
		case <-retry:
		}
		retry = nil
		var body []byte
		gateway := a.Client.endpoints.Current()
		burst := false
		// A panic is one failed advertisement (guard.go), retried.
		err := panicguard.Call(a.logger(), panicguard.SupervisorAdvertise, a.Client.SupervisorID, func() error {
			set := Installations(a.Table, a.Endpoint)
			set.Session = a.Client.Session
			body, _ = json.Marshal(set)
			if bytes.Equal(body, lastSent) && gateway == lastSentTo && time.Since(lastSentAt) < time.Second {
				burst = true // a burst of renewals: the gateway already has this
				return nil
			}
			return a.put(ctx, gateway, body)
		}, "supervisor", a.Client.SupervisorID, "endpoint", gateway)
		if burst {
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if msg := err.Error(); msg != lastErr {
				lastErr = msg
				a.logger().Error("advertising installations failed", "endpoint", gateway,
					"supervisor", a.Client.SupervisorID, "err", err)
			}
			a.Client.failed(gateway, err)
			retry = time.After(backoff.Next(a.Client.retryBound()))
			continue
		}
		backoff.Reset()
		if lastErr != "" {
			a.logger().Info("advertising installations works again", "endpoint", gateway)
			lastErr = ""
		}
		lastSent, lastSentTo, lastSentAt = body, gateway, time.Now()
	}
}

func (a *Advertiser) logger() *slog.Logger {
	if a.Logger != nil {
		return a.Logger
	}
	return a.Client.Logger
}

func (a *Advertiser) put(ctx context.Context, gateway string, body []byte) error {
	c := a.Client
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	q := url.Values{}
	c.sessionQuery(q)
	req, err := c.newRequest(ctx, http.MethodPut, c.supervisorURL(gateway, "/installations")+"?"+q.Encode(), body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		return &api.GatewayConnError{Err: fmt.Errorf("PUT installations: %w", err)}
	}
	defer func() { _ = resp.Body.Close() }()
	c.noteOrder(resp.Header)
	if resp.StatusCode/100 != 2 {
		return readStatusError(resp)
	}
	return nil
}
