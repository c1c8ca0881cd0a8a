package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/applistener/applistener/control/api"
)

// gatewayAdvertisement is the last installations body of one supervisor.
type gatewayAdvertisement struct {
	received      time.Time
	body          []byte            // compact JSON object
	installations []json.RawMessage // the "installations" entries
	routes        []advertisedRoute // the valid entries
	rejected      string            // why the others were left out, for logs
}

func (g *Gateway) serveInstallations(w http.ResponseWriter, r *http.Request) {
	const endpoint = gwEndpointInstallations
	if r.Method != http.MethodPut {
		w.Header().Set("Allow", http.MethodPut)
		g.fail(w, endpoint, http.StatusMethodNotAllowed, "use PUT")
		return
	}
	sup := r.PathValue("id")
	if g.authorize(w, r, endpoint, sup) == nil {
		return
	}
	if r.ContentLength > MaxInstallationsBytes {
		// Refuse before reading: a client that sent "Expect: 100-continue"
		// does not send the body at all.
		g.fail(w, endpoint, http.StatusRequestEntityTooLarge,
			fmt.Sprintf("installations body larger than %d bytes", MaxInstallationsBytes))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxInstallationsBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			g.fail(w, endpoint, http.StatusRequestEntityTooLarge,
				fmt.Sprintf("installations body larger than %d bytes", MaxInstallationsBytes))
			return
		}
		g.fail(w, endpoint, http.StatusBadRequest, "cannot read the request body")
		return
	}
	adv, err := parseInstallations(body)
	if err != nil {
		g.fail(w, endpoint, http.StatusBadRequest, api.OneLineReason(err.Error()))
		return
	}
	now := time.Now()
	adv.received = now
	var rejected []string
	adv.routes, rejected = parseAdvertisedRoutes(sup, adv.installations, now)
	g.mu.Lock()
	adv.rejected = g.logRejectedInstallations(sup, rejected, g.installations[sup].rejected)
	g.storeInstallationsLocked(sup, adv, now)
	g.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
	g.m.request(endpoint, http.StatusNoContent)
	g.log.Debug("gateway installations stored", "supervisor", sup, "installations", len(adv.installations))
}

// parseInstallations checks an installations body: a JSON object with an
// "installations" array of objects. Other top-level fields are kept.
func parseInstallations(body []byte) (gatewayAdvertisement, error) {
	if !utf8.Valid(body) {
		return gatewayAdvertisement{}, errors.New("installations: body is not valid UTF-8")
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, body); err != nil {
		return gatewayAdvertisement{}, fmt.Errorf("installations: not valid JSON: %w", err)
	}
	if compact.Len() == 0 || compact.Bytes()[0] != '{' {
		return gatewayAdvertisement{}, errors.New("installations: body must be a JSON object")
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(compact.Bytes(), &top); err != nil {
		return gatewayAdvertisement{}, fmt.Errorf("installations: %w", err)
	}
	raw, ok := top["installations"]
	if !ok || len(raw) == 0 || raw[0] != '[' {
		return gatewayAdvertisement{}, errors.New(`installations: body must have an "installations" array`)
	}
	var entries []json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return gatewayAdvertisement{}, fmt.Errorf("installations: %w", err)
	}
	for i, e := range entries {
		if len(e) == 0 || e[0] != '{' {
			return gatewayAdvertisement{}, fmt.Errorf("installations[%d]: must be a JSON object", i)
		}
	}
	return gatewayAdvertisement{body: compact.Bytes(), installations: entries}, nil
}
