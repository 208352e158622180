package packet

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pd3-go/pd3/dpu/mirror"
)

// recorder is a mirror whose streams keep what they observe.
type recorder struct {
	mu      sync.Mutex
	streams []*recStream
}

type recStream struct {
	r      *recorder
	data   bytes.Buffer
	closed bool
	late   bool // observed bytes after it was closed
}

func (r *recorder) NewStream() mirror.Stream {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &recStream{r: r}
	r.streams = append(r.streams, s)
	return s
}

func (s *recStream) Observe(b []byte) {
	s.r.mu.Lock()
	s.late = s.late || s.closed
	s.data.Write(b)
	s.r.mu.Unlock()
}

func (s *recStream) Close() {
	s.r.mu.Lock()
	s.closed = true
	s.r.mu.Unlock()
}

func (r *recorder) snapshot() (data []string, closed []bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.streams {
		data = append(data, s.data.String())
		closed = append(closed, s.closed)
	}
	return data, closed
}

// seg builds an IPv4 TCP segment from 10.0.0.1:sport to 10.0.0.2:dport.
func seg(sport, dport uint16, seq uint32, flags byte, payload string) []byte {
	p := make([]byte, 40+len(payload))
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	p[9] = unix.IPPROTO_TCP
	copy(p[12:], []byte{10, 0, 0, 1, 10, 0, 0, 2})
	binary.BigEndian.PutUint16(p[20:], sport)
	binary.BigEndian.PutUint16(p[22:], dport)
	binary.BigEndian.PutUint32(p[24:], seq)
	p[32] = 5 << 4
	p[33] = flags
	copy(p[40:], payload)
	return p
}

func TestSegmentReassembly(t *testing.T) {
	const port = 7000
	const isn = 0xfffffff0 // the sequence wraps inside the stream
	type step struct {
		sport   uint16
		seq     uint32
		flags   byte
		payload string
	}
	for _, tc := range []struct {
		name       string
		steps      []step
		data       []string
		closed     []bool
		gaps       uint64
		unfollowed uint64
	}{
		{"in order across the wrap", []step{{1, isn, tcpSYN, ""}, {1, isn + 1, 0, "hello "}, {1, isn + 7, 0, "world, "}, {1, isn + 14, 0, "wrapped"}},
			[]string{"hello world, wrapped"}, []bool{false}, 0, 0},
		{"retransmissions are trimmed", []step{{1, 100, tcpSYN, ""}, {1, 101, 0, "abcd"}, {1, 101, 0, "abcd"}, {1, 103, 0, "cdef"}, {1, 107, 0, "g"}},
			[]string{"abcdefg"}, []bool{false}, 0, 0},
		{"a hole ends the stream", []step{{1, 100, tcpSYN, ""}, {1, 101, 0, "ab"}, {1, 105, 0, "ef"}, {1, 103, 0, "cd"}},
			[]string{"ab"}, []bool{true}, 1, 1},
		{"FIN closes, RST closes", []step{{1, 100, tcpSYN, ""}, {2, 500, tcpSYN, ""}, {1, 101, tcpFIN, "bye"}, {2, 501, tcpRST, ""}, {1, 104, 0, "late"}},
			[]string{"bye", ""}, []bool{true, true}, 0, 1},
		{"connections seen mid-way are not followed", []step{{3, 900, 0, "middle"}},
			nil, nil, 0, 1},
		{"a reused port starts a new stream", []step{{1, 100, tcpSYN, ""}, {1, 101, 0, "one"}, {1, 7000, tcpSYN, ""}, {1, 7001, 0, "two"}},
			[]string{"one", "two"}, []bool{true, false}, 0, 0},
		{"other ports are ignored", []step{{1, 100, tcpSYN, ""}},
			nil, nil, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{}
			c := &Capture{port: port, m: r, flows: map[flowKey]*flow{}}
			for _, s := range tc.steps {
				dport := uint16(port)
				if tc.name == "other ports are ignored" {
					dport = port + 1
				}
				c.Segment(seg(s.sport, dport, s.seq, s.flags, s.payload))
			}
			data, closed := r.snapshot()
			assert.Equal(t, tc.data, data)
			assert.Equal(t, tc.closed, closed)
			assert.Equal(t, tc.gaps, c.Gaps.Load(), "gaps")
			assert.Equal(t, tc.unfollowed, c.Unfollowed.Load(), "unfollowed")
		})
	}
}

func TestMaxFlows(t *testing.T) {
	r := &recorder{}
	c := &Capture{port: 1, m: r, flows: map[flowKey]*flow{}}
	for i := 0; i < MaxFlows+10; i++ {
		p := seg(uint16(i), 1, 0, tcpSYN, "")
		binary.BigEndian.PutUint16(p[12:], uint16(i>>16)) // vary the source address too
		c.Segment(p)
	}
	assert.Len(t, c.flows, MaxFlows)
}

func FuzzSegment(f *testing.F) {
	f.Add(seg(1, 7000, 5, tcpSYN, ""))
	f.Add(seg(1, 7000, 6, 0, "payload"))
	f.Add(seg(1, 7000, 6, tcpFIN, "x"))
	f.Fuzz(func(t *testing.T, p []byte) {
		r := &recorder{}
		c := &Capture{port: 7000, m: r, flows: map[flowKey]*flow{}}
		c.Segment(seg(1, 7000, 5, tcpSYN, ""))
		c.Segment(p)
		c.Segment(p)
		var observed uint64
		for _, st := range r.streams {
			assert.False(t, st.late, "bytes observed after the stream closed")
			observed += uint64(st.data.Len())
		}
		assert.Equal(t, observed, c.Bytes.Load())
		assert.LessOrEqual(t, len(c.flows), MaxFlows)
	})
}

// FuzzSegmentStreams cuts segments from known byte streams of two
// connections and sends them in whatever order, overlap, repetition and
// flags the fuzzer picks (sequence numbers wrap): what a stream observes
// is always the bytes its connection sent after its SYN, in order, from
// the first — never a wrong, repeated or reordered byte — nothing arrives
// after it closed, and the counters agree with what was observed.
//
// Each op is 3 bytes: the source port (bit 0) and the kind (bits 1–2: data,
// SYN, data with FIN, RST); the offset of the segment from the
// connection's first byte (a SYN: its initial sequence number, just below
// the wrap); the payload's length (0–63).
func FuzzSegmentStreams(f *testing.F) {
	f.Add([]byte{2, 0, 0, 0, 0, 10, 0, 10, 10, 4, 20, 5})
	f.Add([]byte{2, 200, 0, 0, 0, 10, 0, 30, 10, 0, 5, 10, 6, 9, 0})
	f.Add([]byte{3, 1, 0, 2, 7, 0, 1, 0, 8, 0, 0, 8, 0, 4, 4})
	truth := func(sport uint16, at uint32) byte { return byte(at*31) ^ byte(sport*97) }
	f.Fuzz(func(t *testing.T, ops []byte) {
		r := &recorder{}
		c := &Capture{port: 7000, m: r, flows: map[flowKey]*flow{}}
		type conn struct {
			isn    uint32
			stream int // index in r.streams (-1: none yet)
		}
		conns := map[uint16]*conn{1: {stream: -1}, 2: {stream: -1}}
		var started []struct {
			sport uint16
			isn   uint32
		}
		for ; len(ops) >= 3; ops = ops[3:] {
			sport := 1 + uint16(ops[0]&1)
			cn := conns[sport]
			switch kind := ops[0] >> 1 & 3; kind {
			case 1:
				cn.isn = 0xffffff80 + uint32(ops[1])
				c.Segment(seg(sport, 7000, cn.isn, tcpSYN, ""))
				cn.stream = len(r.streams) - 1
				started = append(started, struct {
					sport uint16
					isn   uint32
				}{sport, cn.isn})
			default:
				start := cn.isn + 1 + uint32(ops[1])
				payload := make([]byte, ops[2]&63)
				for i := range payload {
					payload[i] = truth(sport, start+uint32(i))
				}
				flags := map[byte]byte{0: 0, 2: tcpFIN, 3: tcpRST}[kind]
				c.Segment(seg(sport, 7000, start, flags, string(payload)))
			}
		}
		require.Len(t, r.streams, len(started))
		var observed uint64
		for i, st := range r.streams {
			got := st.data.Bytes()
			for j, b := range got {
				if want := truth(started[i].sport, started[i].isn+1+uint32(j)); b != want {
					t.Fatalf("stream %d byte %d is %#x, the connection sent %#x there", i, j, b, want)
				}
			}
			assert.False(t, st.late, "stream %d observed bytes after it closed", i)
			observed += uint64(len(got))
		}
		assert.Equal(t, observed, c.Bytes.Load())
	})
}

// TestCaptureLoopback follows two real connections to a loopback server
// and must see exactly the bytes the clients sent.
func TestCaptureLoopback(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	r := &recorder{}
	c, err := Listen("lo", port, r)
	if errors.Is(err, unix.EPERM) {
		t.Skip("needs CAP_NET_RAW:", err)
	}
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, nc); nc.Close() }()
		}
	}()
	sent := make([][]byte, 2)
	var wg sync.WaitGroup
	for i := range sent {
		sent[i] = make([]byte, 1<<20+i*777)
		rand.Read(sent[i])
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc, err := net.Dial("tcp", ln.Addr().String())
			if !assert.NoError(t, err) {
				return
			}
			defer nc.Close()
			for b := sent[i]; len(b) > 0; {
				n := min(len(b), 1000+i*3000)
				_, err := nc.Write(b[:n])
				if !assert.NoError(t, err) {
					return
				}
				b = b[n:]
			}
		}()
	}
	wg.Wait()
	require.Eventually(t, func() bool {
		_, closed := r.snapshot()
		return len(closed) == 2 && closed[0] && closed[1]
	}, 10*time.Second, 10*time.Millisecond, "both streams are followed to their FIN")
	data, _ := r.snapshot()
	want := []string{string(sent[0]), string(sent[1])}
	if data[0] != want[0] { // the connections may start in either order
		want[0], want[1] = want[1], want[0]
	}
	assert.True(t, data[0] == want[0] && data[1] == want[1], "the mirrored bytes differ from the sent ones")
	assert.Zero(t, c.Gaps.Load())
	assert.Equal(t, uint64(2), c.Streams.Load())
	assert.Equal(t, uint64(len(sent[0])+len(sent[1])), c.Bytes.Load())
}
