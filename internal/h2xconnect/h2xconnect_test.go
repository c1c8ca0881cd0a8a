package h2xconnect_test

import (
	"errors"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/http2"

	"github.com/applistener/applistener/internal/h2xconnect"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serverSettings speaks the client side of an HTTP/2 connection on c (with
// prior knowledge) and returns the SETTINGS the server sent first.
func serverSettings(t *testing.T, c net.Conn) map[http2.SettingID]uint32 {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the server's SETTINGS: %v", err)
		}
		sf, ok := f.(*http2.SettingsFrame)
		if !ok || sf.IsAck() {
			continue
		}
		out := map[http2.SettingID]uint32{}
		_ = sf.ForeachSetting(func(s http2.Setting) error {
			out[s.ID] = s.Val
			return nil
		})
		return out
	}
}

// TestXNetServerAdvertisesExtendedConnect: with this package in the
// program, x/net/http2's server sends SETTINGS_ENABLE_CONNECT_PROTOCOL = 1
// (it sends nothing without http2xconnect=1 in GODEBUG at its init).
func TestXNetServerAdvertisesExtendedConnect(t *testing.T) {
	if !h2xconnect.Enabled() {
		t.Fatal("Enabled() = false")
	}
	if !strings.Contains(getenvGODEBUG(), h2xconnect.Setting) {
		t.Fatalf("GODEBUG = %q; want it to contain %s", getenvGODEBUG(), h2xconnect.Setting)
	}
	cli, srvConn := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		//nolint:staticcheck // SA1019: the server dispatch drives (see dispatch/h2.go).
		(&http2.Server{}).ServeConn(srvConn, &http2.ServeConnOpts{Handler: http.NotFoundHandler()})
	}()
	settings := serverSettings(t, cli)
	_ = cli.Close()
	<-done
	if v, ok := settings[http2.SettingEnableConnectProtocol]; !ok || v != 1 {
		t.Fatalf("ENABLE_CONNECT_PROTOCOL = %d (sent %v); want 1; settings %v", v, ok, settings)
	}
}

// TestStdlibServerKeepsExtendedConnectOff: net/http's own HTTP/2 server
// (the admin endpoints, the gateway) read GODEBUG before this package
// changed it and do not advertise extended CONNECT.
func TestStdlibServerKeepsExtendedConnectOff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: http.NotFoundHandler(), Protocols: &protos, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	settings := serverSettings(t, c)
	_ = c.Close()
	_ = srv.Close()
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Fatal(err)
	}
	if v, ok := settings[http2.SettingEnableConnectProtocol]; ok && v != 0 {
		t.Fatalf("net/http's server advertises ENABLE_CONNECT_PROTOCOL = %d; want it off", v)
	}
}

func getenvGODEBUG() string { return os.Getenv("GODEBUG") }
