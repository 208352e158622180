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
		c := &Capture{port: 7000, m: &recorder{}, flows: map[flowKey]*flow{}}
		c.Segment(seg(1, 7000, 5, tcpSYN, ""))
		c.Segment(p)
		c.Segment(p)
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
