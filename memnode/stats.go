package memnode

import (
	"sync"
	"sync/atomic"
)

// numOps bounds the operation codes Stats counts one by one; codes past it
// (unknown to this server) are counted under op 0.
const numOps = int(OpXor) + 1

// Stats is what a server has done since it started: the sum over its
// connections, open and closed.
type Stats struct {
	// Connections were accepted; Open of them are still served.
	Connections, Open uint64
	// Refused is connections closed before or at HELLO: a wrong token or
	// version, TLS on one side only, a handshake that timed out.
	Refused uint64
	// Requests counts requests by operation code (index 0: unknown codes).
	Requests [numOps]uint64
	// Failed is requests answered with a status other than OK.
	Failed uint64
	// ReadBytes and WrittenBytes are page bytes READ/PREFETCH returned and
	// WRITE carried.
	ReadBytes, WrittenBytes uint64
}

// connStats are one connection's counters. Only its serving goroutine
// adds to them; atomics let a scrape read them meanwhile, uncontended.
type connStats struct {
	requests           [numOps]atomic.Uint64
	failed             atomic.Uint64
	readBytes, wrBytes atomic.Uint64
}

func (c *connStats) request(op Op) {
	if int(op) >= numOps {
		op = 0
	}
	c.requests[op].Add(1)
}

// addTo adds the counters to s.
func (c *connStats) addTo(s *Stats) {
	for i := range c.requests {
		s.Requests[i] += c.requests[i].Load()
	}
	s.Failed += c.failed.Load()
	s.ReadBytes += c.readBytes.Load()
	s.WrittenBytes += c.wrBytes.Load()
}

// serverStats holds the connections being served and the sum of those
// that ended, so a scrape is a walk of the open ones and costs the data
// path nothing but its own uncontended atomics.
type serverStats struct {
	mu          sync.Mutex
	open        map[*connStats]struct{}
	closed      Stats
	connections uint64
	refused     uint64
}

// start counts a new connection and returns its counters.
func (s *serverStats) start() *connStats {
	c := new(connStats)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open == nil {
		s.open = make(map[*connStats]struct{})
	}
	s.open[c] = struct{}{}
	s.connections++
	return c
}

// end folds an ended connection's counters into the closed sum; refused
// says it never got past HELLO.
func (s *serverStats) end(c *connStats, refused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.open, c)
	c.addTo(&s.closed)
	if refused {
		s.refused++
	}
}

// Stats returns what the server has done so far.
func (s *Server) Stats() Stats {
	st := &s.stats
	st.mu.Lock()
	defer st.mu.Unlock()
	out := st.closed
	out.Connections, out.Open, out.Refused = st.connections, uint64(len(st.open)), st.refused
	for c := range st.open {
		c.addTo(&out)
	}
	return out
}
