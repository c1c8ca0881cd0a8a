package e2e

// A small driver for a real headless Chromium over the DevTools protocol
// (CDP), so that tests can check what a browser does with the listener:
// cookies, HTTP/2, WebSockets.
//
// Trust: the test CA goes into a real NSS database at $HOME/.pki/nssdb,
// with HOME a temporary directory for the browser only, and certutil
// (Debian's libnss3-tools). Chromium on Linux trusts the anchors it finds
// there, so certificates are verified as they would be for a user (chain,
// names, validity), not waved through as with
// --ignore-certificate-errors-spki-list.
//
// Names: --host-resolver-rules maps *.<domain> to 127.0.0.1, so test URLs
// keep their real host names (the SNI, the Host header and cookie domains
// are those a user would have) and the port is the listener's.
//
// Chromium and certutil come from scripts/test-deps.sh (`make deps`).
// Without them the browser tests skip, or fail when CI is set.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

const (
	chromiumPath = "/usr/bin/chromium"

	// browserStartTimeout bounds the browser's start (a few seconds on
	// a quiet machine; CI is a noisy 2-core machine running -race).
	browserStartTimeout = 30 * time.Second
	// browserCallTimeout bounds one CDP command, including a navigation
	// up to its load event.
	browserCallTimeout = 30 * time.Second
)

// browser is one headless Chromium process with one page (tab) attached
// over CDP. Its methods are for the test goroutine; they fail the test on
// errors unless their name starts with try.
type browser struct {
	t       testing.TB
	cmd     *exec.Cmd
	stderr  *browserStderr
	exited  chan struct{} // closed when the process has been waited for
	release chan struct{} // ends the goroutine that owns the launching thread

	conn    *websocket.Conn
	writeMu sync.Mutex
	nextID  atomic.Int64
	session string        // CDP session of the page
	readEnd chan struct{} // closed when the reader goroutine (started with conn) has returned

	mu        sync.Mutex
	readErr   error                       // why the reader stopped
	pending   map[int64]chan cdpMessage   // commands waiting for their answer
	waiters   []*cdpWaiter                // one-shot event subscriptions
	received  []browserResponse           // every Network.responseReceived, in order
	byRequest map[string]*browserResponse // the same, by request id (last wins)

	closeOnce sync.Once
}

// browserResponse is one HTTP response the page received
// (Network.responseReceived).
type browserResponse struct {
	RequestID string
	URL       string
	Status    int
	Protocol  string // "h2", "http/1.1", ...
	Type      string // "Document", "Fetch", "XHR", ...
	Header    map[string]string
}

// browserCookie is one cookie in the browser's store (Network.getCookies).
type browserCookie struct {
	Name     string  `json:"name"`
	Value    string  `json:"value"`
	Domain   string  `json:"domain"`
	Path     string  `json:"path"`
	Expires  float64 `json:"expires"` // seconds since the epoch; -1 for a session cookie
	HTTPOnly bool    `json:"httpOnly"`
	Secure   bool    `json:"secure"`
	Session  bool    `json:"session"`
	SameSite string  `json:"sameSite"`
}

type cdpError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    string `json:"data"`
}

func (e *cdpError) Error() string {
	if e.Data != "" {
		return fmt.Sprintf("CDP error %d: %s (%s)", e.Code, e.Message, e.Data)
	}
	return fmt.Sprintf("CDP error %d: %s", e.Code, e.Message)
}

type cdpMessage struct {
	ID        int64           `json:"id,omitempty"`
	Method    string          `json:"method,omitempty"`
	Params    json.RawMessage `json:"params,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     *cdpError       `json:"error,omitempty"`
	SessionID string          `json:"sessionId,omitempty"`
}

// cdpWaiter receives the first event of its method (on the page's
// session) that match accepts.
type cdpWaiter struct {
	method string
	match  func(json.RawMessage) bool
	ch     chan json.RawMessage // capacity 1
}

// browserStderr keeps Chromium's stderr and reports the DevTools URL once
// it has been printed.
type browserStderr struct {
	mu    sync.Mutex
	buf   []byte
	url   string
	found chan struct{}
}

var devtoolsLine = regexp.MustCompile(`DevTools listening on (ws://\S+)`)

func (s *browserStderr) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.buf) < 1<<20 {
		s.buf = append(s.buf, p...)
	}
	if s.url == "" {
		if m := devtoolsLine.FindSubmatch(s.buf); m != nil {
			s.url = string(m[1])
			close(s.found)
		}
	}
	return len(p), nil
}

func (s *browserStderr) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.buf)
}

func (s *browserStderr) devtoolsURL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.url
}

// browserAvailable skips the test when Chromium or certutil is missing,
// or fails it when CI is set.
func browserAvailable(t testing.TB) {
	t.Helper()
	var missing []string
	if _, err := os.Stat(chromiumPath); err != nil {
		missing = append(missing, chromiumPath)
	}
	if _, err := exec.LookPath("certutil"); err != nil {
		missing = append(missing, "certutil (libnss3-tools)")
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("browser test needs %s: run scripts/test-deps.sh as root", strings.Join(missing, " and "))
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// testCAFile writes the e2e CA (makeCerts) to a file for newBrowser.
func testCAFile(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(path, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// newBrowser starts a headless Chromium that trusts the CA in caPEMPath
// and resolves every *.domain name to 127.0.0.1, with a fresh profile and
// one blank page. It is closed on cleanup (Close may also be called
// earlier); its stderr is logged if the test failed.
func newBrowser(t testing.TB, caPEMPath, domain string) *browser {
	t.Helper()
	browserAvailable(t)
	// A short directory, not t.TempDir(): Chromium's singleton socket
	// lives under it and a Unix socket path must fit in 108 bytes, which
	// a long test name would overflow.
	dir, err := os.MkdirTemp("", "chr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	home := filepath.Join(dir, "home")
	profile := filepath.Join(dir, "profile")
	for _, d := range []string{home, profile} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	trustCA(t, home, caPEMPath)

	args := []string{
		"--headless",
		"--no-sandbox",
		"--disable-gpu",
		"--disable-quic",
		"--disable-dev-shm-usage", // CI containers often have a tiny /dev/shm
		"--no-first-run",
		"--no-default-browser-check",
		"--disable-background-networking",
		"--disable-component-update",
		"--disable-sync",
		"--disable-breakpad",
		"--no-proxy-server", // ignore any http(s)_proxy in the environment
		"--remote-debugging-port=0",
		"--user-data-dir=" + profile,
		"--host-resolver-rules=MAP *." + domain + " 127.0.0.1",
		"about:blank",
	}
	b := &browser{
		t:         t,
		stderr:    &browserStderr{found: make(chan struct{})},
		exited:    make(chan struct{}),
		release:   make(chan struct{}),
		readEnd:   make(chan struct{}),
		pending:   map[int64]chan cdpMessage{},
		byRequest: map[string]*browserResponse{},
	}
	b.cmd = exec.Command(chromiumPath, args...)
	b.cmd.Env = browserEnv(home, dir)
	b.cmd.Stdout = b.stderr
	b.cmd.Stderr = b.stderr
	b.cmd.WaitDelay = 5 * time.Second
	b.cmd.SysProcAttr = browserProcAttr()
	if err := b.launch(); err != nil {
		t.Fatalf("starting %s: %v", chromiumPath, err)
	}
	t.Cleanup(func() {
		b.Close()
		if t.Failed() {
			t.Logf("chromium stderr:\n%s", b.stderr.String())
		}
	})

	start := time.Now()
	timer := time.NewTimer(browserStartTimeout)
	defer timer.Stop()
	select {
	case <-b.stderr.found:
	case <-b.exited:
		t.Fatalf("chromium exited during start (%v); stderr:\n%s", b.cmd.ProcessState, b.stderr.String())
	case <-timer.C:
		t.Fatalf("chromium printed no DevTools URL within %v; stderr:\n%s", browserStartTimeout, b.stderr.String())
	}
	if err := b.connect(time.Until(start.Add(browserStartTimeout))); err != nil {
		t.Fatalf("connecting to chromium's DevTools at %s: %v", b.stderr.devtoolsURL(), err)
	}
	return b
}

// launch starts the process from a goroutine locked to its OS thread,
// which stays alive until Close: Pdeathsig fires when the thread that
// started the child ends, and Go may end threads on its own otherwise.
func (b *browser) launch() error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := b.cmd.Start(); err != nil {
			started <- err
			close(b.exited)
			return
		}
		started <- nil
		go func() {
			_ = b.cmd.Wait()
			close(b.exited)
		}()
		<-b.release
		<-b.exited // the thread must outlive the process
	}()
	return <-started
}

// browserEnv is the environment of the browser: this process's, with HOME
// (and the XDG directories) in dir, so that Chromium reads the NSS
// database trustCA made and writes nothing outside the test's directory.
func browserEnv(home, dir string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR", "TMPDIR":
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		"HOME="+home,
		"XDG_CONFIG_HOME="+filepath.Join(home, ".config"),
		"XDG_CACHE_HOME="+filepath.Join(home, ".cache"),
		"XDG_DATA_HOME="+filepath.Join(home, ".local", "share"),
		"TMPDIR="+dir,
	)
}

// trustCA creates the NSS database $home/.pki/nssdb and adds the CA in
// caPEMPath as a trusted TLS issuer (trust flags C,,).
func trustCA(t testing.TB, home, caPEMPath string) {
	t.Helper()
	db := filepath.Join(home, ".pki", "nssdb")
	if err := os.MkdirAll(db, 0o700); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "certutil", args...)
		cmd.Env = append(os.Environ(), "HOME="+home)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("certutil %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("-N", "-d", "sql:"+db, "--empty-password")
	run("-A", "-d", "sql:"+db, "-t", "C,,", "-n", "applistener-e2e-ca", "-i", caPEMPath)
}

// connect opens the DevTools WebSocket, makes a blank page and attaches to
// it (one flat session), and enables the Page and Network domains.
func (b *browser) connect(within time.Duration) error {
	d := websocket.Dialer{HandshakeTimeout: max(within, time.Second)}
	conn, resp, err := d.Dial(b.stderr.devtoolsURL(), nil)
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	if err != nil {
		return err
	}
	conn.SetReadLimit(64 << 20)
	b.conn = conn
	go b.readLoop()

	var target struct {
		TargetID string `json:"targetId"`
	}
	if err := b.callSession("", "Target.createTarget", map[string]any{"url": "about:blank"}, &target); err != nil {
		return err
	}
	var attached struct {
		SessionID string `json:"sessionId"`
	}
	if err := b.callSession("", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &attached); err != nil {
		return err
	}
	b.mu.Lock()
	b.session = attached.SessionID
	b.mu.Unlock()
	for _, m := range []string{"Page.enable", "Network.enable", "Runtime.enable"} {
		if err := b.call(m, nil, nil); err != nil {
			return err
		}
	}
	return nil
}

// readLoop delivers answers to their commands and events to the waiters,
// and records responses, until the connection ends.
func (b *browser) readLoop() {
	defer close(b.readEnd)
	for {
		_, data, err := b.conn.ReadMessage()
		if err != nil {
			b.mu.Lock()
			b.readErr = err
			b.mu.Unlock()
			return
		}
		var m cdpMessage
		if err := json.Unmarshal(data, &m); err != nil {
			continue
		}
		if m.ID != 0 {
			b.mu.Lock()
			ch := b.pending[m.ID]
			delete(b.pending, m.ID)
			b.mu.Unlock()
			if ch != nil {
				ch <- m // capacity 1, one answer per id
			}
			continue
		}
		if m.SessionID == "" || m.SessionID != b.sessionID() {
			continue // the browser's own events, or another target's
		}
		if m.Method == "Network.responseReceived" {
			b.recordResponse(m.Params)
		}
		b.mu.Lock()
		kept := b.waiters[:0]
		for _, w := range b.waiters {
			if w.method == m.Method && (w.match == nil || w.match(m.Params)) {
				w.ch <- m.Params // capacity 1, removed once served
				continue
			}
			kept = append(kept, w)
		}
		clear(b.waiters[len(kept):])
		b.waiters = kept
		b.mu.Unlock()
	}
}

func (b *browser) sessionID() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.session
}

func (b *browser) recordResponse(params json.RawMessage) {
	var ev struct {
		RequestID string `json:"requestId"`
		Type      string `json:"type"`
		Response  struct {
			URL      string            `json:"url"`
			Status   int               `json:"status"`
			Protocol string            `json:"protocol"`
			Headers  map[string]string `json:"headers"`
		} `json:"response"`
	}
	if err := json.Unmarshal(params, &ev); err != nil {
		return
	}
	r := browserResponse{
		RequestID: ev.RequestID, URL: ev.Response.URL, Status: ev.Response.Status,
		Protocol: ev.Response.Protocol, Type: ev.Type, Header: ev.Response.Headers,
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.received = append(b.received, r)
	b.byRequest[r.RequestID] = &r
}

// waitFor subscribes to the next event of method on the page that match
// accepts (nil: any); receive from the channel, with a deadline.
func (b *browser) waitFor(method string, match func(json.RawMessage) bool) chan json.RawMessage {
	w := &cdpWaiter{method: method, match: match, ch: make(chan json.RawMessage, 1)}
	b.mu.Lock()
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()
	return w.ch
}

func (b *browser) unwait(ch chan json.RawMessage) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, w := range b.waiters {
		if w.ch == ch {
			b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
			return
		}
	}
}

// call sends a command to the page's session and decodes its result into
// out (if not nil), within browserCallTimeout.
func (b *browser) call(method string, params, out any) error {
	return b.callSession(b.sessionID(), method, params, out)
}

func (b *browser) callSession(session, method string, params, out any) error {
	id := b.nextID.Add(1)
	msg := map[string]any{"id": id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	if session != "" {
		msg["sessionId"] = session
	}
	data, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	ch := make(chan cdpMessage, 1)
	b.mu.Lock()
	b.pending[id] = ch
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.pending, id)
		b.mu.Unlock()
	}()

	b.writeMu.Lock()
	_ = b.conn.SetWriteDeadline(time.Now().Add(browserCallTimeout))
	err = b.conn.WriteMessage(websocket.TextMessage, data)
	b.writeMu.Unlock()
	if err != nil {
		return fmt.Errorf("%s: write: %w", method, err)
	}

	timer := time.NewTimer(browserCallTimeout)
	defer timer.Stop()
	select {
	case m := <-ch:
		if m.Error != nil {
			return fmt.Errorf("%s: %w", method, m.Error)
		}
		if out != nil {
			if err := json.Unmarshal(m.Result, out); err != nil {
				return fmt.Errorf("%s: decoding result %s: %w", method, m.Result, err)
			}
		}
		return nil
	case <-b.readEnd:
		b.mu.Lock()
		err := b.readErr
		b.mu.Unlock()
		return fmt.Errorf("%s: DevTools connection ended: %v", method, err)
	case <-timer.C:
		return fmt.Errorf("%s: no answer within %v", method, browserCallTimeout)
	}
}

// navigate loads url in the page and waits for its load event. It fails
// the test if the navigation fails (a TLS or network error) or no load
// event comes; it returns the main document's response (nil if there
// was none, as for about:blank).
func (b *browser) navigate(t testing.TB, url string) *browserResponse {
	t.Helper()
	r, err := b.tryNavigate(url)
	if err != nil {
		t.Fatalf("navigate to %s: %v", url, err)
	}
	return r
}

// tryNavigate is navigate returning an error; a failed navigation's error
// carries Chromium's net error, e.g. "net::ERR_CERT_AUTHORITY_INVALID".
func (b *browser) tryNavigate(url string) (*browserResponse, error) {
	loaded := b.waitFor("Page.loadEventFired", nil)
	defer b.unwait(loaded)
	var nav struct {
		FrameID   string `json:"frameId"`
		LoaderID  string `json:"loaderId"`
		ErrorText string `json:"errorText"`
	}
	if err := b.call("Page.navigate", map[string]any{"url": url}, &nav); err != nil {
		return nil, err
	}
	if nav.ErrorText != "" {
		return nil, errors.New(nav.ErrorText)
	}
	if nav.LoaderID == "" {
		return nil, nil // a same-document navigation: no load event
	}
	timer := time.NewTimer(browserCallTimeout)
	defer timer.Stop()
	select {
	case <-loaded:
	case <-b.readEnd:
		return nil, errors.New("DevTools connection ended before the load event")
	case <-timer.C:
		return nil, fmt.Errorf("no load event within %v", browserCallTimeout)
	}
	// The main resource's request id is its loader id; its
	// responseReceived came before the load event on the same connection.
	b.mu.Lock()
	defer b.mu.Unlock()
	if r := b.byRequest[nav.LoaderID]; r != nil {
		c := *r
		return &c, nil
	}
	return nil, nil
}

// eval evaluates the JavaScript expression js in the page, awaiting it if
// it is a promise, and returns its value: a string as is, anything else as
// JSON (undefined as ""). It fails the test if js throws.
func (b *browser) eval(t testing.TB, js string) string {
	t.Helper()
	v, err := b.tryEval(js)
	if err != nil {
		t.Fatalf("eval %q: %v", js, err)
	}
	return v
}

// tryEval is eval returning an error, for example what js threw.
func (b *browser) tryEval(js string) (string, error) {
	var res struct {
		Result struct {
			Type  string          `json:"type"`
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception *struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	err := b.call("Runtime.evaluate", map[string]any{
		"expression":    js,
		"returnByValue": true,
		"awaitPromise":  true,
		"userGesture":   true,
	}, &res)
	if err != nil {
		return "", err
	}
	if e := res.ExceptionDetails; e != nil {
		if e.Exception != nil && e.Exception.Description != "" {
			return "", errors.New(e.Exception.Description)
		}
		return "", errors.New(e.Text)
	}
	if len(res.Result.Value) == 0 {
		return "", nil
	}
	var s string
	if json.Unmarshal(res.Result.Value, &s) == nil {
		return s, nil
	}
	return string(res.Result.Value), nil
}

// cookies returns the cookies the browser would send to url.
func (b *browser) cookies(t testing.TB, url string) []browserCookie {
	t.Helper()
	var res struct {
		Cookies []browserCookie `json:"cookies"`
	}
	if err := b.call("Network.getCookies", map[string]any{"urls": []string{url}}, &res); err != nil {
		t.Fatalf("cookies for %s: %v", url, err)
	}
	return res.Cookies
}

// lastProtocol returns the protocol ("h2", "http/1.1") of the last
// response the page received, or "" if none.
func (b *browser) lastProtocol() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.received) == 0 {
		return ""
	}
	return b.received[len(b.received)-1].Protocol
}

// Close kills the browser with its process group and waits for it and for
// the reader goroutine. It is safe to call more than once.
func (b *browser) Close() {
	b.closeOnce.Do(func() {
		if b.conn != nil {
			_ = b.conn.Close() // ends readLoop
		}
		if b.cmd.Process != nil {
			killProcessGroup(b.cmd.Process)
		}
		close(b.release)
		select {
		case <-b.exited:
		case <-time.After(15 * time.Second):
			b.t.Errorf("chromium (pid %d) did not exit within 15s of SIGKILL", b.cmd.Process.Pid)
		}
		if b.conn != nil {
			<-b.readEnd
		}
	})
}
