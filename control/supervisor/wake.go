package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/wake"
)

// wakeTimeout bounds one wake request to a gateway: the gateway waits for
// the platform's hook (its attempts and backoff) before it answers.
const wakeTimeout = 35 * time.Second

// Wake asks the gateway to wake a sleeping instance of this supervisor's
// document (POST /v1/supervisors/{id}/instances/{ws}/{sb}/wake with the
// session); the gateway forwards it to the platform's hook. It returns nil
// when the platform accepted (or the gateway's document has the instance
// active already): the instance becomes active through the document. It
// returns a *wake.CannotWakeError when the platform cannot wake it, and
// another error when the gateway or the platform could not be asked; a
// connection error or a 5xx moves to the next gateway endpoint. It makes
// the client a wake.Waker for the data plane's coordinator.
func (c *GatewayClient) Wake(ctx context.Context, key wake.Key) error {
	if c.client == nil {
		return errors.New("gateway client not initialised")
	}
	var err error
	for range c.endpoints.Len() {
		endpoint := c.endpoints.Current()
		if err = c.wakeAt(ctx, endpoint, key); err == nil || ctx.Err() != nil || !api.IsGatewayFailover(err) {
			return err
		}
		c.failed(endpoint, err)
	}
	return err
}

func (c *GatewayClient) wakeAt(ctx context.Context, endpoint string, key wake.Key) error {
	ctx, cancel := context.WithTimeout(ctx, wakeTimeout)
	defer cancel()
	q := url.Values{}
	c.sessionQuery(q)
	u := c.supervisorURL(endpoint, "/instances/"+url.PathEscape(key.Workspace)+"/"+url.PathEscape(key.Sandbox)+"/wake") + "?" + q.Encode()
	req, err := c.newRequest(ctx, http.MethodPost, u, nil)
	if err != nil {
		return err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return &api.GatewayConnError{Err: fmt.Errorf("POST wake: %w", err)}
	}
	defer func() { _ = resp.Body.Close() }()
	switch resp.StatusCode {
	case http.StatusOK, http.StatusAccepted:
		return nil
	case http.StatusConflict:
		if ct := resp.Header.Get("Content-Type"); ct == "application/json" {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			return &wake.CannotWakeError{Reason: wake.RefusalReason(body)}
		}
	}
	return readStatusError(resp)
}
