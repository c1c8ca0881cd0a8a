package h2engine

import (
	"golang.org/x/net/http2"
)

// errNoSettings: the client's first frame is not its SETTINGS.
var errNoSettings = connError{http2.ErrCodeProtocol, "the client preface must be followed by SETTINGS"}

// processFrame acts on one frame read from the client (HEADERS frames
// are read and parsed by readHeaders). Errors are connError or
// streamError values (handleError answers them).
func (c *Conn) processFrame(f http2.Frame) error {
	if !c.sawSettings {
		sf, ok := f.(*http2.SettingsFrame)
		if !ok || sf.IsAck() {
			return errNoSettings
		}
		c.sawSettings = true
	}
	switch f := f.(type) {
	case *http2.DataFrame:
		return c.processData(f)
	case *http2.ContinuationFrame:
		return c.feedBlock(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.SettingsFrame:
		return c.processSettings(f)
	case *http2.PingFrame:
		return c.processPing(f)
	case *http2.WindowUpdateFrame:
		return c.processWindowUpdate(f)
	case *http2.RSTStreamFrame:
		return c.processRST(f)
	case *http2.PriorityFrame:
		if f.StreamDep == f.StreamID {
			return streamError{f.StreamID, http2.ErrCodeProtocol, "stream depends on itself"}
		}
		return nil
	case *http2.GoAwayFrame:
		c.processGoAway()
		return nil
	case *http2.PushPromiseFrame:
		return connError{http2.ErrCodeProtocol, "PUSH_PROMISE from a client"}
	default:
		// Unknown and ignored frame types (PRIORITY_UPDATE).
		return nil
	}
}

func (c *Conn) processSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		// The server sends one SETTINGS frame, in its preface.
		if c.settingsAcked {
			return connError{http2.ErrCodeProtocol, "SETTINGS acknowledgement for no SETTINGS"}
		}
		c.settingsAcked = true
		return nil
	}
	if f.NumSettings() > 100 {
		// As x/net's server: no client needs as many. (x/net refused
		// duplicated settings too, which RFC 9113 6.5.3 has processed in
		// order.)
		return connError{http2.ErrCodeProtocol, "more than 100 settings"}
	}
	var err error
	wake := false
	c.mu.Lock()
	_ = f.ForeachSetting(func(s http2.Setting) error { // its error is err
		if verr := s.Valid(); verr != nil {
			if ce, ok := verr.(http2.ConnectionError); ok {
				err = connError{http2.ErrCode(ce), "invalid setting " + s.String()}
			} else {
				err = connError{http2.ErrCodeProtocol, "invalid setting " + s.String()}
			}
			return err
		}
		switch s.ID {
		case http2.SettingHeaderTableSize:
			c.encTableSize.Store(int64(s.Val))
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.peerInitWin
			c.peerInitWin = int64(s.Val)
			for _, st := range c.streams {
				if st.sendWin+delta > maxWindow {
					err = connError{http2.ErrCodeFlowControl, "SETTINGS_INITIAL_WINDOW_SIZE overflows a stream window"}
					return err
				}
				st.sendWin += delta
			}
			wake = wake || delta > 0
		case http2.SettingMaxFrameSize:
			c.peerMaxFrame.Store(s.Val)
		case http2.SettingEnableConnectProtocol:
			if s.Val > 1 {
				err = connError{http2.ErrCodeProtocol, "invalid SETTINGS_ENABLE_CONNECT_PROTOCOL"}
				return err
			}
		}
		return nil
	})
	if err != nil {
		c.mu.Unlock()
		return err
	}
	// The acknowledgement is queued before the writers given window
	// wake: it goes out ahead of the DATA that uses the new settings.
	queued := c.queueCtrl(ctrlFrame{kind: ctrlSettingsAck})
	if wake {
		for _, st := range c.streams {
			st.wakeWriter()
		}
	}
	c.mu.Unlock()
	if !queued {
		return errCtrlFlood
	}
	c.kickCtrl()
	return nil
}

func (c *Conn) processPing(f *http2.PingFrame) error {
	if f.IsAck() {
		return nil
	}
	return c.queueCtrlFromReader(ctrlFrame{kind: ctrlPingAck, data: f.Data})
}

func (c *Conn) processRST(f *http2.RSTStreamFrame) error {
	c.mu.Lock()
	st := c.lookup(f.StreamID)
	if st == nil {
		idle := f.StreamID > c.maxSeen
		c.mu.Unlock()
		if idle {
			return connError{http2.ErrCodeProtocol, "RST_STREAM on an idle stream"}
		}
		return nil
	}
	after := st.resetLocked(streamResetError{code: f.ErrCode})
	c.mu.Unlock()
	if after != nil {
		after()
	}
	if !c.chargeReset() {
		return errRapidReset
	}
	return nil
}

// processGoAway: the client opens no more streams; the connection closes
// once the running ones are done.
func (c *Conn) processGoAway() {
	// The client opens no more streams; the connection stays until the
	// client closes it, its streams end, or the idle timeout. Closing an
	// idle one at once would reset it (RST) when the client's next frames
	// (a PING, its own close) arrive unread, which RFC 9113 §5.4.1 and
	// h2spec ("MUST NOT trigger any special behavior") count against us.
	c.mu.Lock()
	c.draining = true
	c.mu.Unlock()
}

func (c *Conn) processData(f *http2.DataFrame) error {
	id, n := f.StreamID, int64(f.Length)
	data := f.Data()
	c.mu.Lock()
	if n > c.recvAvail {
		c.mu.Unlock()
		return connError{http2.ErrCodeFlowControl, "DATA beyond the connection window"}
	}
	c.recvAvail -= n
	st := c.lookup(id)
	if st == nil || st.remoteClosed {
		// Not for a stream that takes data: the window it used is the
		// connection's to give back.
		c.creditConnLocked(n)
		var err error
		switch {
		case st != nil:
			err = streamError{id, http2.ErrCodeStreamClosed, "DATA after END_STREAM"}
		case id > c.maxSeen:
			err = connError{http2.ErrCodeProtocol, "DATA on an idle stream"}
		default:
			if _, byUs := c.recentlyClosed(id); !byUs {
				err = streamError{id, http2.ErrCodeStreamClosed, "DATA on a closed stream"}
			}
		}
		c.mu.Unlock()
		c.kickCtrl()
		return err
	}
	if n > st.recvAvail {
		c.creditConnLocked(n)
		c.mu.Unlock()
		return streamError{id, http2.ErrCodeFlowControl, "DATA beyond the stream window"}
	}
	st.recvAvail -= n
	if pad := n - int64(len(data)); pad > 0 {
		// Padding is flow-controlled but never read: give it back now.
		st.recvUnacked += pad
		c.creditConnLocked(pad)
	}
	st.recvTotal += int64(len(data))
	if st.ContentLength >= 0 && st.recvTotal > st.ContentLength {
		c.mu.Unlock()
		return streamError{id, http2.ErrCodeProtocol, "more DATA than content-length"}
	}
	if len(data) > 0 {
		st.appendBody(data)
	}
	if f.StreamEnded() {
		if st.ContentLength >= 0 && st.recvTotal != st.ContentLength {
			c.mu.Unlock()
			return streamError{id, http2.ErrCodeProtocol, "less DATA than content-length"}
		}
		st.endRemoteLocked()
	}
	st.wakeReader()
	c.mu.Unlock()
	c.kickCtrl()
	return nil
}
