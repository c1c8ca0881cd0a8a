package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/applistener/applistener/control/api"
	"github.com/applistener/applistener/control/internal/pollfile"
	"github.com/applistener/applistener/routes"
)

// authorize checks the bearer token for supervisor sup: a supervisor token
// for sup, or a pool token, which binds sup to its pool on first use. On
// failure it answers the request and returns nil.
func (g *Gateway) authorize(w http.ResponseWriter, r *http.Request, endpoint, sup string) *tokenGrant {
	token, ok := bearerToken(r.Header)
	if !ok {
		w.Header().Set("WWW-Authenticate", "Bearer")
		g.fail(w, endpoint, http.StatusUnauthorized, "missing bearer token")
		g.log.Debug("gateway request refused: missing bearer token", "endpoint", endpoint, "remote", r.RemoteAddr)
		return nil
	}
	st := g.state.Load()
	t := st.lookupDigest(sha256.Sum256([]byte(token)))
	if t == nil {
		w.Header().Set("WWW-Authenticate", "Bearer")
		g.fail(w, endpoint, http.StatusUnauthorized, "unknown token")
		g.log.Info("gateway request refused: unknown token", "endpoint", endpoint, "remote", r.RemoteAddr)
		return nil
	}
	switch {
	case len(t.workspaces) > 0:
		g.fail(w, endpoint, http.StatusForbidden, "a workspace token cannot read or write supervisor state")
		g.log.Warn("gateway request refused: workspace token used for a supervisor endpoint",
			"endpoint", endpoint, "supervisor", sup, "remote", r.RemoteAddr)
		return nil
	case t.admin:
		g.fail(w, endpoint, http.StatusForbidden, "an admin token cannot act as a supervisor")
		g.log.Warn("gateway request refused: admin token used for a supervisor endpoint",
			"endpoint", endpoint, "supervisor", sup, "remote", r.RemoteAddr)
		return nil
	case t.pool != "":
		if !g.authorizePool(w, r, endpoint, st, t, sup) {
			return nil
		}
		return t
	case t.supervisor != sup:
		g.fail(w, endpoint, http.StatusForbidden, "the token is not granted this supervisor")
		g.log.Warn("gateway request refused: token of another supervisor",
			"endpoint", endpoint, "supervisor", sup, "token_supervisor", t.supervisor, "remote", r.RemoteAddr)
		return nil
	}
	return t
}

// authorizePool checks pool token t for supervisor sup and binds sup to
// t's pool when no pool has it yet (the binding is stored: the first pool
// wins). On failure it answers the request and returns false.
func (g *Gateway) authorizePool(w http.ResponseWriter, r *http.Request, endpoint string, st *stateSnapshot, t *tokenGrant, sup string) bool {
	if err := validSupervisorID(sup); err != nil {
		g.fail(w, endpoint, http.StatusBadRequest, api.OneLineReason(err.Error()))
		return false
	}
	if st.namesSupervisor(sup) {
		g.fail(w, endpoint, http.StatusForbidden, "this supervisor id has a token of its own; a pool token cannot use it")
		g.log.Warn("gateway request refused: pool token for a supervisor id that has its own token",
			"endpoint", endpoint, "supervisor", sup, "pool", t.pool, "remote", r.RemoteAddr)
		return false
	}
	for attempt := 0; ; attempt++ {
		bound, rev := g.poolBinding(sup)
		if bound == t.pool {
			return true
		}
		if bound != "" {
			g.fail(w, endpoint, http.StatusForbidden, "this supervisor id is bound to another pool")
			g.log.Warn("gateway request refused: supervisor id bound to another pool",
				"endpoint", endpoint, "supervisor", sup, "pool", t.pool, "bound_pool", bound, "remote", r.RemoteAddr)
			return false
		}
		if why := g.storeUnusable(); why != "" {
			g.unavailable(w, endpoint, why)
			return false
		}
		if attempt > 0 {
			g.unavailable(w, endpoint, "the pool binding could not be stored")
			return false
		}
		ctx, cancel := context.WithTimeout(r.Context(), etcdOpTimeout)
		wrote, ok, err := g.store.put(ctx, keyPools+sup, []byte(t.pool), putOptions{cond: rev})
		if err == nil {
			err = g.waitApplied(ctx, wrote)
		}
		cancel()
		if err != nil {
			g.log.Error("pool binding not stored", "supervisor", sup, "pool", t.pool, "err", err)
			g.unavailable(w, endpoint, "the store cannot be written")
			return false
		}
		if ok {
			g.log.Info("supervisor id bound to a pool", "supervisor", sup, "pool", t.pool)
			return true
		}
	}
}

// bearerToken returns the token of the request's one Authorization header
// with the Bearer scheme (any case).
func bearerToken(h http.Header) (string, bool) {
	vals := h.Values("Authorization")
	if len(vals) != 1 {
		return "", false
	}
	scheme, token, ok := strings.Cut(strings.TrimSpace(vals[0]), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// tokensFile is the tokens file.
type tokensFile struct {
	Tokens *[]tokenEntry `json:"tokens"`
}

type tokenEntry struct {
	Token      string   `json:"token"`
	Supervisor string   `json:"supervisor"`
	Workspaces []string `json:"workspaces"`
	Admin      bool     `json:"admin"`
	Pool       string   `json:"pool"`
}

// loadTokens reads and parses the tokens file.
func loadTokens(path string) (pollfile.Identity, []tokenGrant, error) {
	id, _ := pollfile.Stat(path)
	data, err := pollfile.ReadLimited(path, MaxTokensBytes)
	if err != nil {
		return id, nil, fmt.Errorf("tokens file: %w", err)
	}
	tokens, err := parseTokens(data)
	if err != nil {
		return id, nil, fmt.Errorf("tokens file %s: %w", path, err)
	}
	return id, tokens, nil
}

// parseTokens parses {"tokens": [...]}. Unknown fields are refused.
// Each entry has a token (1 to MaxTokenLen visible ASCII characters, not
// repeated) and exactly one of a supervisor id, a non-empty list of
// workspace names, "admin": true or a pool name. Errors never contain a
// token.
func parseTokens(data []byte) ([]tokenGrant, error) {
	if !utf8.Valid(data) {
		return nil, errors.New("not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f tokensFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("cannot parse: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("data after the top-level object")
	}
	if f.Tokens == nil {
		return nil, errors.New(`missing "tokens" array`)
	}
	out := make([]tokenGrant, 0, len(*f.Tokens))
	seen := make(map[[sha256.Size]byte]int, len(*f.Tokens))
	for i, e := range *f.Tokens {
		if e.Token == "" {
			return nil, fmt.Errorf("tokens[%d]: empty token", i)
		}
		if len(e.Token) > MaxTokenLen {
			return nil, fmt.Errorf("tokens[%d]: token longer than %d characters", i, MaxTokenLen)
		}
		for j := 0; j < len(e.Token); j++ {
			if c := e.Token[j]; c < 0x21 || c > 0x7e {
				return nil, fmt.Errorf("tokens[%d]: token has a character outside visible ASCII", i)
			}
		}
		t := tokenGrant{digest: sha256.Sum256([]byte(e.Token))}
		if j, dup := seen[t.digest]; dup {
			return nil, fmt.Errorf("tokens[%d]: same token as tokens[%d]", i, j)
		}
		seen[t.digest] = i
		var kinds []string
		if e.Supervisor != "" {
			kinds = append(kinds, "a supervisor")
		}
		if len(e.Workspaces) > 0 {
			kinds = append(kinds, "workspaces")
		}
		if e.Admin {
			kinds = append(kinds, "admin")
		}
		if e.Pool != "" {
			kinds = append(kinds, "a pool")
		}
		switch {
		case len(kinds) > 1:
			return nil, fmt.Errorf("tokens[%d]: has both %s and %s (a token is exactly one kind)", i, kinds[0], kinds[1])
		case e.Supervisor != "":
			if err := validSupervisorID(e.Supervisor); err != nil {
				return nil, fmt.Errorf("tokens[%d]: %w", i, err)
			}
			t.supervisor = e.Supervisor
		case len(e.Workspaces) > 0:
			for _, ws := range e.Workspaces {
				if err := routes.ValidName(ws); err != nil {
					return nil, fmt.Errorf("tokens[%d]: workspace: %w", i, err)
				}
			}
			t.workspaces = append([]string(nil), e.Workspaces...)
		case e.Admin:
			t.admin = true
		case e.Pool != "":
			if err := validSupervisorID(e.Pool); err != nil {
				return nil, fmt.Errorf("tokens[%d]: pool name: %w", i, err)
			}
			t.pool = e.Pool
		default:
			return nil, fmt.Errorf("tokens[%d]: needs a supervisor or workspaces (or admin, or a pool)", i)
		}
		out = append(out, t)
	}
	return out, nil
}
