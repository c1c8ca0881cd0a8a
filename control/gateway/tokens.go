package gateway

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/applistener/applistener/control/internal/pollfile"
	"github.com/applistener/applistener/routes"
)

// gatewayState is one immutable generation of the gateway's files.
type gatewayState struct {
	docs   map[string]gatewayDocument
	tokens []gatewayToken
	// grants are, per supervisor, the services its section declares: what
	// discovery may publish from its advertisements.
	grants map[string]map[grantKey]struct{}
}

// gatewayToken is one entry of the tokens file. Only the SHA-256 digest of
// the token is kept.
type gatewayToken struct {
	digest     [sha256.Size]byte
	supervisor string
	workspaces []string
}

// lookupDigest returns the token whose digest is d, or nil. It compares d
// with every token in constant time.
func (s *gatewayState) lookupDigest(d [sha256.Size]byte) *gatewayToken {
	var found *gatewayToken
	for i := range s.tokens {
		if subtle.ConstantTimeCompare(d[:], s.tokens[i].digest[:]) == 1 {
			found = &s.tokens[i]
		}
	}
	return found
}

// authorize checks the bearer token for supervisor sup. On failure it
// answers the request and returns nil.
func (g *Gateway) authorize(w http.ResponseWriter, r *http.Request, endpoint, sup string) *gatewayToken {
	token, ok := bearerToken(r.Header)
	if !ok {
		w.Header().Set("WWW-Authenticate", "Bearer")
		g.fail(w, endpoint, http.StatusUnauthorized, "missing bearer token")
		g.log.Debug("gateway request refused: missing bearer token", "endpoint", endpoint, "remote", r.RemoteAddr)
		return nil
	}
	t := g.state.Load().lookupDigest(sha256.Sum256([]byte(token)))
	if t == nil {
		w.Header().Set("WWW-Authenticate", "Bearer")
		g.fail(w, endpoint, http.StatusUnauthorized, "unknown token")
		g.log.Info("gateway request refused: unknown token", "endpoint", endpoint, "remote", r.RemoteAddr)
		return nil
	}
	if t.supervisor == "" {
		g.fail(w, endpoint, http.StatusForbidden, "a workspace token cannot read or write supervisor state")
		g.log.Warn("gateway request refused: workspace token used for a supervisor endpoint",
			"endpoint", endpoint, "supervisor", sup, "remote", r.RemoteAddr)
		return nil
	}
	if t.supervisor != sup {
		g.fail(w, endpoint, http.StatusForbidden, "the token is not granted this supervisor")
		g.log.Warn("gateway request refused: token of another supervisor",
			"endpoint", endpoint, "supervisor", sup, "token_supervisor", t.supervisor, "remote", r.RemoteAddr)
		return nil
	}
	return t
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

// gatewayTokensFile is the tokens file.
type gatewayTokensFile struct {
	Tokens *[]gatewayTokenEntry `json:"tokens"`
}

type gatewayTokenEntry struct {
	Token      string   `json:"token"`
	Supervisor string   `json:"supervisor"`
	Workspaces []string `json:"workspaces"`
}

// loadGatewayTokens reads and parses the tokens file.
func loadGatewayTokens(path string) (pollfile.Identity, []gatewayToken, error) {
	id, _ := pollfile.Stat(path)
	data, err := pollfile.ReadLimited(path, MaxTokensBytes)
	if err != nil {
		return id, nil, fmt.Errorf("tokens file: %w", err)
	}
	tokens, err := parseGatewayTokens(data)
	if err != nil {
		return id, nil, fmt.Errorf("tokens file %s: %w", path, err)
	}
	return id, tokens, nil
}

// parseGatewayTokens parses {"tokens": [...]}. Unknown fields are refused.
// Each entry has a token (1 to MaxTokenLen visible ASCII characters, not
// repeated) and exactly one of a supervisor id or a non-empty list of
// workspace names. Errors never contain a token.
func parseGatewayTokens(data []byte) ([]gatewayToken, error) {
	if !utf8.Valid(data) {
		return nil, errors.New("not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f gatewayTokensFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("cannot parse: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("data after the top-level object")
	}
	if f.Tokens == nil {
		return nil, errors.New(`missing "tokens" array`)
	}
	out := make([]gatewayToken, 0, len(*f.Tokens))
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
		t := gatewayToken{digest: sha256.Sum256([]byte(e.Token))}
		if j, dup := seen[t.digest]; dup {
			return nil, fmt.Errorf("tokens[%d]: same token as tokens[%d]", i, j)
		}
		seen[t.digest] = i
		switch {
		case e.Supervisor != "" && len(e.Workspaces) > 0:
			return nil, fmt.Errorf("tokens[%d]: has both a supervisor and workspaces (a token is one or the other)", i)
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
		default:
			return nil, fmt.Errorf("tokens[%d]: needs a supervisor or workspaces", i)
		}
		out = append(out, t)
	}
	return out, nil
}
