package connector

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// echoServer accepts connections on ln and answers every line with
// "<name> <line>"; it stops when ln is closed and the test ends.
func echoServer(t testing.TB, ln net.Listener, name string) {
	t.Helper()
	done := make(chan struct{})
	conns := make(chan net.Conn, 64)
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case conns <- c:
			default:
			}
			go serveLines(c, name)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		for {
			select {
			case c := <-conns:
				_ = c.Close()
			default:
				return
			}
		}
	})
}

// serveLines answers each line read from c with "<name> <line>" until EOF.
func serveLines(c net.Conn, name string) {
	defer func() { _ = c.Close() }()
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		if _, err := io.WriteString(c, name+" "+line); err != nil {
			return
		}
	}
}

// ask sends one line on c and returns the answer line.
func ask(t testing.TB, c net.Conn, line string) string {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatalf("write: %v", err)
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("read answer to %q: %v", line, err)
	}
	return strings.TrimSuffix(got, "\n")
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// boundPort returns a loopback port that is bound (so nobody else takes it)
// but never listens: connecting to it is refused.
func boundPort(t testing.TB) int {
	t.Helper()
	return testutil.DeadLoopbackPort(t)
}

func TestTCPDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	echoServer(t, ln, "tcp-app")
	port := ln.Addr().(*net.TCPAddr).Port

	var c Connector = TCP{Host: "127.0.0.1"}
	if got := c.String(); got != "tcp:127.0.0.1" {
		t.Errorf("String() = %q; want tcp:127.0.0.1", got)
	}
	conn, err := c.Dial(testCtx(t), port)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer func() { _ = conn.Close() }()
	if got := conn.RemoteAddr().String(); got != ln.Addr().String() {
		t.Errorf("RemoteAddr = %s; want %s", got, ln.Addr())
	}
	if _, ok := conn.(*net.TCPConn); !ok {
		t.Errorf("Dial returned %T; want *net.TCPConn", conn)
	}
	for i := range 3 {
		msg := "ping " + strconv.Itoa(i)
		if got := ask(t, conn, msg); got != "tcp-app "+msg {
			t.Fatalf("answer %q; want %q", got, "tcp-app "+msg)
		}
	}
}

func TestTCPDialIPv6Loopback(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	echoServer(t, ln, "v6-app")
	conn, err := TCP{Host: "::1"}.Dial(testCtx(t), ln.Addr().(*net.TCPAddr).Port)
	if err != nil {
		t.Fatalf("Dial [::1]: %v", err)
	}
	defer func() { _ = conn.Close() }()
	if got := ask(t, conn, "hi"); got != "v6-app hi" {
		t.Fatalf("answer %q", got)
	}
}

// A refused connection means the app is not listening: an error, but not
// ErrUnavailable (the instance is still there).
func TestTCPDialRefused(t *testing.T) {
	_, err := TCP{Host: "127.0.0.1"}.Dial(testCtx(t), boundPort(t))
	if err == nil {
		t.Fatal("Dial to a port nobody listens on succeeded")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("error %v; want ECONNREFUSED", err)
	}
	if errors.Is(err, ErrUnavailable) {
		t.Errorf("error %v wraps ErrUnavailable; a refused port is the app's failure, not a vanished instance", err)
	}
	if !strings.Contains(err.Error(), "tcp connector") {
		t.Errorf("error %q does not name the connector", err)
	}
}

func TestTCPDialCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	conn, err := TCP{Host: "127.0.0.1"}.Dial(ctx, ln.Addr().(*net.TCPAddr).Port)
	if err == nil {
		_ = conn.Close()
		t.Fatal("Dial with a cancelled context succeeded")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v; want context.Canceled", err)
	}
}

func TestUnixPath(t *testing.T) {
	for _, tc := range []struct {
		tmpl string
		port int
		want string
	}{
		{"/run/sbx/demo/{port}.sock", 8080, "/run/sbx/demo/8080.sock"},
		{"/run/sbx/demo/{port}.sock", 1, "/run/sbx/demo/1.sock"},
		{"/run/sbx/demo/{port}.sock", 65535, "/run/sbx/demo/65535.sock"},
		{"/run/sbx/{port}/app-{port}.sock", 3000, "/run/sbx/3000/app-3000.sock"},
		{"/run/sbx/demo/fixed.sock", 8080, "/run/sbx/demo/fixed.sock"},
	} {
		if got := (Unix{PathTemplate: tc.tmpl}).Path(tc.port); got != tc.want {
			t.Errorf("Unix{%q}.Path(%d) = %q; want %q", tc.tmpl, tc.port, got, tc.want)
		}
	}
	if got := (Unix{PathTemplate: "/x/{port}.sock"}).String(); got != "unix:/x/{port}.sock" {
		t.Errorf("String() = %q", got)
	}
}

// shortTempDir returns a temporary directory whose paths fit sun_path.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "alc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func TestUnixDial(t *testing.T) {
	dir := shortTempDir(t)
	tmpl := filepath.Join(dir, "{port}.sock")
	// Two ports of one instance, two sockets: the placeholder picks the one.
	for _, port := range []int{8080, 3000} {
		ln, err := net.Listen("unix", filepath.Join(dir, strconv.Itoa(port)+".sock"))
		if err != nil {
			t.Fatal(err)
		}
		echoServer(t, ln, "unix-"+strconv.Itoa(port))
	}
	var c Connector = Unix{PathTemplate: tmpl}
	for _, port := range []int{8080, 3000, 8080} {
		conn, err := c.Dial(testCtx(t), port)
		if err != nil {
			t.Fatalf("Dial(%d): %v", port, err)
		}
		want := "unix-" + strconv.Itoa(port) + " hello"
		if got := ask(t, conn, "hello"); got != want {
			t.Errorf("Dial(%d) reached %q; want %q", port, got, want)
		}
		if got, want := conn.RemoteAddr().String(), filepath.Join(dir, strconv.Itoa(port)+".sock"); got != want {
			t.Errorf("RemoteAddr = %q; want %q", got, want)
		}
		_ = conn.Close()
	}
}

// A port without a socket in an existing directory: the app is not
// listening. That is an error but not ErrUnavailable.
func TestUnixDialNoSocket(t *testing.T) {
	dir := shortTempDir(t)
	_, err := Unix{PathTemplate: filepath.Join(dir, "{port}.sock")}.Dial(testCtx(t), 9999)
	if err == nil {
		t.Fatal("Dial to a missing socket succeeded")
	}
	if !strings.Contains(err.Error(), "unix connector") {
		t.Errorf("error %q does not name the connector", err)
	}
	if errors.Is(err, ErrUnavailable) {
		t.Errorf("error %v wraps ErrUnavailable although the instance's socket directory exists", err)
	}

	// A stale socket file whose listener is gone: refused.
	path := filepath.Join(dir, "7000.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = ln.Close()
	_, err = Unix{PathTemplate: filepath.Join(dir, "{port}.sock")}.Dial(testCtx(t), 7000)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("Dial to a stale socket: %v; want ECONNREFUSED", err)
	}
	if errors.Is(err, ErrUnavailable) {
		t.Errorf("Dial to a stale socket: %v wraps ErrUnavailable", err)
	}
}

// The Connector contract (connector.go): "Errors wrap ErrUnavailable when
// the instance itself is gone (its namespace or socket directory
// disappeared)". A unix connector whose socket directory no longer exists
// must say so.
func TestUnixDialDirectoryGone(t *testing.T) {
	dir := filepath.Join(shortTempDir(t), "sandbox-gone")
	_, err := Unix{PathTemplate: filepath.Join(dir, "{port}.sock")}.Dial(testCtx(t), 8080)
	if err == nil {
		t.Fatal("Dial into a missing directory succeeded")
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("Dial with the socket directory gone: %v; want an error wrapping ErrUnavailable (Connector contract)", err)
	}
}
