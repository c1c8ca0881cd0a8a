package h2engine

import (
	"time"

	"golang.org/x/net/http2"
)

// Flow control (RFC 9113 5.2, 6.9). Receiving: DATA is buffered in its
// Stream, at most the stream's window, and window is given back as the
// handler reads (creditLocked, creditConnLocked). Sending: Write takes
// window (reserve), WINDOW_UPDATE and SETTINGS_INITIAL_WINDOW_SIZE give it
// (processWindowUpdate, processSettings), and what was taken but not sent
// is given back (giveBack).

// processWindowUpdate adds a WINDOW_UPDATE's increment to the stream's or
// the connection's send window and wakes the writers waiting for it.
func (c *Conn) processWindowUpdate(f *http2.WindowUpdateFrame) error {
	inc := int64(f.Increment)
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.StreamID == 0 {
		if c.sendWin+inc > maxWindow {
			return connError{http2.ErrCodeFlowControl, "connection window above 2^31-1"}
		}
		c.sendWin += inc
		for i, st := range c.waiters {
			st.wakeWriter()
			c.waiters[i] = nil
		}
		c.waiters = c.waiters[:0]
		return nil
	}
	st := c.lookup(f.StreamID)
	if st == nil {
		if f.StreamID > c.maxSeen {
			return connError{http2.ErrCodeProtocol, "WINDOW_UPDATE on an idle stream"}
		}
		return nil // closed: ignored
	}
	if st.sendWin+inc > maxWindow {
		return streamError{f.StreamID, http2.ErrCodeFlowControl, "stream window above 2^31-1"}
	}
	st.sendWin += inc
	st.wakeWriter()
	return nil
}

// creditConnLocked gives n bytes of connection window back, by
// WINDOW_UPDATE once half the window is owed (c.mu held).
func (c *Conn) creditConnLocked(n int64) {
	c.recvUnacked += n
	if c.recvUnacked >= int64(c.cfg.ConnWindowSize)/2 {
		c.queueCtrl(ctrlFrame{kind: ctrlWindowUpdate, val: uint32(c.recvUnacked)})
		c.recvAvail += c.recvUnacked
		c.recvUnacked = 0
	}
}

// creditLocked gives n consumed bytes of window back to the client, by
// WINDOW_UPDATE once half a window is owed (c.mu held).
func (st *Stream) creditLocked(n int64) {
	c := st.c
	c.creditConnLocked(n)
	if st.remoteClosed {
		return
	}
	st.recvUnacked += n
	if st.recvUnacked >= int64(c.cfg.InitialWindowSize)/2 {
		c.queueCtrl(ctrlFrame{kind: ctrlWindowUpdate, id: st.id, val: uint32(st.recvUnacked)})
		st.recvAvail += st.recvUnacked
		st.recvUnacked = 0
	}
}

// reserve takes up to want bytes (and at most a frame) of the stream's
// and the connection's send windows, waiting for them.
func (st *Stream) reserve(want int) (int, error) {
	c := st.c
	var timer *time.Timer
	c.mu.Lock()
	for {
		if st.resetErr != nil || c.closing {
			err := st.resetErr
			if err == nil {
				err = ErrConnClosed
			}
			c.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return 0, err
		}
		n := min(int64(want), int64(c.peerMaxFrame.Load()), st.sendWin, c.sendWin)
		if n > 0 {
			st.sendWin -= n
			c.sendWin -= n
			c.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return int(n), nil
		}
		st.writeWaiting = true
		if c.sendWin <= 0 {
			c.waiters = append(c.waiters, st)
		}
		c.mu.Unlock()
		// What is buffered goes out before waiting: the client may wait
		// for it before it gives window.
		c.lockWrite()
		_ = c.unlockWrite(true)
		if timer == nil {
			timer = time.NewTimer(c.cfg.WriteTimeout)
		}
		select {
		case <-st.writeWake:
			c.mu.Lock()
		case <-timer.C:
			c.mu.Lock()
			st.writeWaiting = false
			f := st.resetLocked(streamResetError{code: http2.ErrCodeCancel, byUs: true})
			c.mu.Unlock()
			if f != nil {
				f()
			}
			c.report(ErrorEvent{StreamID: st.id, Code: http2.ErrCodeCancel, Reason: "no flow-control window within the write timeout"})
			c.queueCtrl(ctrlFrame{kind: ctrlRST, id: st.id, val: uint32(http2.ErrCodeCancel)})
			c.lockWrite()
			_ = c.unlockWrite(true)
			return 0, ErrWriteTimeout
		}
	}
}

// giveBack returns n reserved bytes that were not sent.
func (c *Conn) giveBack(st *Stream, n int) {
	if n == 0 {
		return
	}
	c.mu.Lock()
	st.sendWin += int64(n)
	c.sendWin += int64(n)
	for i, w := range c.waiters {
		w.wakeWriter()
		c.waiters[i] = nil
	}
	c.waiters = c.waiters[:0]
	c.mu.Unlock()
}
