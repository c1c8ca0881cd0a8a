//go:build linux

package sock

import (
	"testing"
	"time"

	"github.com/applistener/applistener/internal/testutil"
)

// TestPeerHungUp: a peer's hang-up (an HTTP/1.1 client's) is seen without reading,
// also when bytes it sent are still unread.
func TestPeerHungUp(t *testing.T) {
	cl, srv := tcpPair(t)
	if PeerHungUp(srv) {
		t.Fatal("hung up before anything happened")
	}
	if _, err := cl.Write([]byte("body bytes")); err != nil {
		t.Fatal(err)
	}
	if err := WaitReadable(srv); err != nil { // the bytes arrived, unread
		t.Fatal(err)
	}
	if PeerHungUp(srv) {
		t.Fatal("unread bytes taken for a hang-up")
	}
	_ = cl.Close()
	testutil.Eventually(t, 5*time.Second, "the hang-up to be seen", func() bool { return PeerHungUp(srv) })
	b := make([]byte, 32)
	if n, _ := srv.Read(b); string(b[:n]) != "body bytes" {
		t.Errorf("read %q after the check; want the client's bytes intact", b[:n])
	}
	_ = srv.Close()
	if !PeerHungUp(srv) {
		t.Error("a connection closed here is not reported as gone")
	}
}
