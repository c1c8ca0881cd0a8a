package routes

import (
	"log/slog"
	"sync"
	"testing"
	"time"
)

// TestUsageActivity: /v1/usage's activity fields: the last request, the
// last WebSocket frame in either direction (open or closed sockets), and
// the open WebSockets silent for the threshold or longer.
func TestUsageActivity(t *testing.T) {
	clock := newFakeClock()
	table := NewTable(Options{Domain: tbDomain, Freshness: time.Hour, Clock: clock, Logger: slog.New(slog.DiscardHandler)})
	defer table.Close()
	d, err := ParseDocument([]byte(`{"instances":[{"workspace":"a","sandbox":"one","services":[{"name":"web","port":8080}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	table.Apply(d)
	inst := table.Lookup(Hostname("a", "one", "web", tbDomain)).Instance
	usage := func(silentAfter time.Duration) InstanceUsage {
		t.Helper()
		list := table.UsageWith(UsageOptions{SilentAfter: silentAfter})
		if len(list) != 1 {
			t.Fatalf("usage %+v", list)
		}
		return list[0]
	}
	if u := usage(0); u.LastRequest != nil || u.LastWebSocketFrame != nil || u.WebSocketsSilent != 0 {
		t.Fatalf("before traffic: %+v", u)
	}
	t0 := clock.Now()
	inst.NoteRequest(t0)
	hmr := inst.TrackWebSocket(t0) // opened, never a frame
	chat := inst.TrackWebSocket(t0)
	short := inst.TrackWebSocket(t0)
	clock.Advance(time.Minute)
	chat.Frame(clock.Now())
	clock.Advance(time.Minute)
	short.Frame(clock.Now())
	short.Close()
	short.Close() // twice: nothing more
	clock.Advance(10 * time.Minute)

	u := usage(0) // the default: 5 minutes
	if u.LastRequest == nil || !u.LastRequest.Equal(t0) {
		t.Errorf("last_request %v, want %v", u.LastRequest, t0)
	}
	if u.LastWebSocketFrame == nil || !u.LastWebSocketFrame.Equal(t0.Add(2*time.Minute)) {
		t.Errorf("last_websocket_frame %v, want the closed socket's frame at +2m", u.LastWebSocketFrame)
	}
	if u.WebSocketsSilent != 2 {
		t.Errorf("websockets_silent %d after 10 minutes, want 2 (both open sockets)", u.WebSocketsSilent)
	}
	if u := usage(11*time.Minute + 30*time.Second); u.WebSocketsSilent != 1 {
		t.Errorf("silent for 11.5 minutes: %d, want 1 (the one that never sent a frame)", u.WebSocketsSilent)
	}
	chat.Frame(clock.Now())
	if u := usage(0); u.WebSocketsSilent != 1 || !u.LastWebSocketFrame.Equal(clock.Now()) {
		t.Errorf("after a frame on chat: silent %d, last frame %v", u.WebSocketsSilent, u.LastWebSocketFrame)
	}
	hmr.Close()
	chat.Close()
	if u := usage(0); u.WebSocketsSilent != 0 || !u.LastWebSocketFrame.Equal(clock.Now()) {
		t.Errorf("all closed: silent %d, last frame %v", u.WebSocketsSilent, u.LastWebSocketFrame)
	}
	// nil receivers (no instance) do nothing.
	var none *Instance
	none.NoteRequest(t0)
	none.TrackWebSocket(t0).Frame(t0)
	none.TrackWebSocket(t0).Close()
}

// Recording is cheap: no allocation per request or frame, and safe under
// concurrent frames, opens and closes (run with -race).
func TestActivityRecording(t *testing.T) {
	inst := &Instance{}
	ws := inst.TrackWebSocket(time.Now())
	now := time.Now()
	if n := testing.AllocsPerRun(1000, func() { inst.NoteRequest(now); ws.Frame(now) }); n != 0 {
		t.Fatalf("NoteRequest and Frame allocate %v times", n)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				a := inst.TrackWebSocket(time.Now())
				a.Frame(time.Now())
				ws.Frame(time.Now())
				_, _, _ = inst.activityAt(time.Now(), time.Second)
				a.Close()
			}
		})
	}
	wg.Wait()
	ws.Close()
	if _, _, silent := inst.activityAt(time.Now(), 0); silent != 0 || len(inst.act.open) != 0 {
		t.Fatalf("%d silent, %d open after every socket closed", silent, len(inst.act.open))
	}
}
