package pipeline

import (
	"sync"
	"sync/atomic"
)

// Cork lets a producer that knows more requests are coming hold back the
// frames the sessions sharing it send, and write each session's frames
// with one write when it lets go (docs/decisions.md, 48). A host's NBD
// reader holds it over a burst of requests it reads at once, and a
// write-back batch over its sends: their requests for one memory node
// leave together, instead of one write and one wake-up of the node per
// request.
//
// Whoever holds the cork must release it before anything that may wait
// (for input, for a queue, for a response): a frame held while its
// sender's holder waits on that frame's answer would never leave. Frames
// sent by other goroutines while the cork is held wait for the next
// release of any holder, which the rule above bounds. The one wait a
// holder cannot see is a session dialling its node again on the way
// (the handshake is a request answered before the dial returns, and a
// dial may take its timeout): a dial suspends the cork (Suspend), so
// that no frame waits for it.
//
// A nil *Cork holds nothing.
type Cork struct {
	held, suspended atomic.Int32
	mu              sync.Mutex
	// dirty are the writers holding frames for a release; each is in it
	// once (BatchWriter.corked). Guarded by mu.
	dirty []*BatchWriter
}

// Hold starts holding frames back until the matching Release.
func (c *Cork) Hold() {
	if c != nil {
		c.held.Add(1)
	}
}

// Release ends a Hold and writes the frames held back: each writer's with
// one write (on the caller's goroutine if the writer is idle).
func (c *Cork) Release() {
	if c == nil {
		return
	}
	c.held.Add(-1)
	c.flush()
}

// Suspend makes the cork hold nothing until the matching Resume, and
// writes what it holds: for a dial, whose handshake is waited for on the
// spot.
func (c *Cork) Suspend() {
	if c != nil {
		c.suspended.Add(1)
		c.flush()
	}
}

// Resume ends a Suspend.
func (c *Cork) Resume() {
	if c != nil {
		c.suspended.Add(-1)
	}
}

// flush writes the frames held back, each writer's with one write.
func (c *Cork) flush() {
	var batch [16]*BatchWriter
	c.mu.Lock()
	for len(c.dirty) > 0 {
		n := copy(batch[:], c.dirty)
		c.dirty = append(c.dirty[:0], c.dirty[n:]...)
		for _, w := range batch[:n] {
			w.corked = false
		}
		c.mu.Unlock()
		for i, w := range batch[:n] {
			w.Flush()
			batch[i] = nil
		}
		c.mu.Lock()
	}
	c.mu.Unlock()
}

// holding reports whether frames are being held back now.
func (c *Cork) holding() bool {
	return c != nil && c.held.Load() > 0 && c.suspended.Load() == 0
}

// add makes sure the frames w took with EndLater are written: by the
// release of a holder, or now if nobody holds the cork any more.
func (c *Cork) add(w *BatchWriter) {
	c.mu.Lock()
	if c.holding() {
		if !w.corked {
			w.corked = true
			c.dirty = append(c.dirty, w)
		}
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	w.Flush()
}
