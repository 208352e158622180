package pipeline

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/sockio"
	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A toy protocol: request = u32 tag | u32 n; response = u32 tag | u32 n | n
// bytes of 0xAB.
type toy struct{}

func (toy) PutTag(h []byte, tag uint32) { binary.LittleEndian.PutUint32(h, tag) }
func (toy) ReadHeader(r *bufio.Reader) (Header, error) {
	var b [8]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return Header{}, err
	}
	return Header{Tag: binary.LittleEndian.Uint32(b[:]), PayloadLen: int(binary.LittleEndian.Uint32(b[4:]))}, nil
}

// toyServer answers each request after <-release.
func toyServer(t *testing.T, nc net.Conn, release <-chan struct{}) {
	go func() {
		var b [8]byte
		for {
			if _, err := io.ReadFull(nc, b[:]); err != nil {
				return
			}
			<-release
			n := binary.LittleEndian.Uint32(b[4:])
			resp := append(b[:], make([]byte, n)...)
			for i := 8; i < len(resp); i++ {
				resp[i] = 0xAB
			}
			if _, err := nc.Write(resp); err != nil {
				return
			}
		}
	}()
}

func send(t *testing.T, s *Session, dst []byte) *Call {
	c := s.Get()
	c.Dst = dst
	var h [8]byte
	binary.LittleEndian.PutUint32(h[4:], uint32(len(dst)))
	require.NoError(t, s.Send(c, h[:], nil))
	return c
}

func TestAbandonedCallIsNeverWritten(t *testing.T) {
	cl, sv := net.Pipe()
	release := make(chan struct{})
	toyServer(t, sv, release)
	s := New(cl, toy{}, Options{})
	defer s.Close(io.EOF)

	dst := make([]byte, 64)
	c := send(t, s, dst)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, c.Wait(ctx), context.DeadlineExceeded)
	close(release) // the late response arrives now
	// A second call round-trips, so the first response has been consumed.
	dst2 := make([]byte, 8)
	require.NoError(t, send(t, s, dst2).Wait(context.Background()))
	assert.Equal(t, make([]byte, 64), dst, "abandoned buffer was written")
	assert.Equal(t, []byte{0xAB, 0xAB, 0xAB, 0xAB, 0xAB, 0xAB, 0xAB, 0xAB}, dst2)
}

func TestBrokenConnectionFailsEveryCall(t *testing.T) {
	cl, sv := net.Pipe()
	release := make(chan struct{})
	toyServer(t, sv, release)
	s := New(cl, toy{}, Options{})
	defer s.Close(io.EOF)
	calls := make([]*Call, 10)
	for i := range calls {
		calls[i] = send(t, s, make([]byte, 4))
	}
	sv.Close()
	for _, c := range calls {
		err := c.Wait(context.Background())
		assert.Error(t, err)
	}
	assert.Error(t, s.Err())
	c := s.Get()
	assert.Error(t, s.Send(c, make([]byte, 8), nil), "a broken session refuses new calls")
}

func TestWatchdogTimesOut(t *testing.T) {
	cl, sv := net.Pipe()
	defer sv.Close()
	go io.Copy(io.Discard, sv) // swallows requests, never answers
	s := New(cl, toy{}, Options{OpTimeout: 50 * time.Millisecond})
	defer s.Close(io.EOF)
	c := send(t, s, make([]byte, 4))
	err := c.Wait(context.Background())
	assert.ErrorIs(t, err, ErrTimeout)
}

// The watchdog times silence, not a call's age: calls answered one at a
// time, each well within OpTimeout, all succeed though the last waits
// several timeouts in all.
func TestWatchdogSparesASlowButLiveConnection(t *testing.T) {
	cl, sv := net.Pipe()
	release := make(chan struct{})
	toyServer(t, sv, release)
	s := New(cl, toy{}, Options{OpTimeout: 200 * time.Millisecond})
	defer s.Close(io.EOF)
	calls := make([]*Call, 8)
	for i := range calls {
		calls[i] = send(t, s, make([]byte, 4))
	}
	go func() {
		for range calls {
			// Answers 50 ms apart, each within the 200 ms timeout and
			// several timeouts in all: the spacing is the point.
			time.Sleep(50 * time.Millisecond)
			release <- struct{}{}
		}
	}()
	for i, c := range calls {
		require.NoError(t, c.Wait(context.Background()), "call %d", i)
	}
}

// TestCompletionFunctions: calls with Fn complete on the session's
// goroutines with their payload in place, mixed with waited calls, and
// fail through Fn when the connection breaks.
func TestCompletionFunctions(t *testing.T) {
	cl, sv := net.Pipe()
	release := make(chan struct{})
	close(release)
	toyServer(t, sv, release)
	s := New(cl, toy{}, Options{})
	defer s.Close(io.EOF)

	type result struct {
		err error
		n   int
		dst []byte
	}
	results := make(chan result, 8)
	fn := func(c *Call) { results <- result{c.Err(), c.N, c.Arg.([]byte)} }
	for i := 0; i < 8; i++ {
		c := s.Get()
		dst := make([]byte, 16+i)
		c.Dst, c.Fn, c.Arg = dst, fn, dst
		var h [8]byte
		binary.LittleEndian.PutUint32(h[4:], uint32(len(dst)))
		require.NoError(t, s.Send(c, h[:], nil))
		if i%3 == 0 { // waited calls in between
			require.NoError(t, send(t, s, make([]byte, 4)).Wait(context.Background()))
		}
	}
	for i := 0; i < 8; i++ {
		r := <-results
		require.NoError(t, r.err)
		assert.Equal(t, len(r.dst), r.n)
		assert.Equal(t, bytes.Repeat([]byte{0xAB}, len(r.dst)), r.dst)
	}

	// A broken connection completes pending Fn calls with its error.
	cl2, sv2 := net.Pipe()
	go io.Copy(io.Discard, sv2) // never answers
	s2 := New(cl2, toy{}, Options{})
	defer s2.Close(io.EOF)
	for i := 0; i < 4; i++ {
		c := s2.Get()
		c.Dst, c.Fn = make([]byte, 4), fn
		c.Arg = c.Dst
		require.NoError(t, s2.Send(c, make([]byte, 8), nil))
	}
	sv2.Close()
	for i := 0; i < 4; i++ {
		select {
		case r := <-results:
			assert.Error(t, r.err)
		case <-time.After(5 * time.Second):
			t.Fatal("a call with Fn was never completed")
		}
	}
}

// TestMixedPayloadsArriveWhole: small and large payloads back to back in
// one stream (large ones are read past the buffer, straight from the
// socket) each reach their own destination intact.
func TestMixedPayloadsArriveWhole(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	sizes := []int{100, 300 << 10, 4 << 10, 128 << 10, 70 << 10, directPayload - 1, directPayload, 10, 1 << 20, 3}
	pattern := func(tag uint32, i int) byte { return byte(int(tag)*7 + i) }
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		var out []byte
		for range sizes {
			var b [8]byte
			if _, err := io.ReadFull(nc, b[:]); err != nil {
				return
			}
			tag, n := binary.LittleEndian.Uint32(b[:]), int(binary.LittleEndian.Uint32(b[4:]))
			out = append(out, b[:]...)
			for i := range n {
				out = append(out, pattern(tag, i))
			}
		}
		nc.Write(out) // every response in one burst
		io.Copy(io.Discard, nc)
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	s := New(nc, toy{}, Options{ReadBuf: 256 << 10})
	defer s.Close(io.EOF)
	calls, dsts := make([]*Call, len(sizes)), make([][]byte, len(sizes))
	for i, n := range sizes {
		dsts[i] = make([]byte, n)
		calls[i] = send(t, s, dsts[i])
	}
	for i, c := range calls {
		require.NoError(t, c.Wait(context.Background()), "call %d", i)
		// Each payload counts up from a first byte of its own (its tag's).
		d, ok := dsts[i], true
		for j := range d {
			ok = ok && d[j] == d[0]+byte(j)
		}
		require.True(t, ok, "payload %d (%d bytes) corrupted", i, sizes[i])
	}
}

// After the reader hands a response to a waiting caller it parks in the
// network poller, not poll(2): the caller is queued on the reader's P,
// which a thread blocked in poll(2) would keep. Responses completed by
// Fn (no one to wake) keep the poll(2) wait. Each response comes late
// enough that the reader is waiting for it; poll(2)'s returns are counted.
func TestReaderLeavesItsPToTheCallerItWoke(t *testing.T) {
	cl, sv := tcpPair(t)
	release := make(chan struct{})
	toyServer(t, sv, release)
	var busy sockio.Busy // lone, with a gauge of readers in poll(2)
	s := New(cl, toy{}, Options{Busy: &busy})
	defer s.Close(io.EOF)
	require.NotNil(t, s.fast)

	poll := true // where the reader's next wait is expected
	answerLate := func() {
		if poll {
			require.Eventually(t, func() bool { return busy.Polls() > 0 }, 10*time.Second, 50*time.Microsecond,
				"the reader waits in poll(2)")
		} else {
			testutil.LetPark() // in the network poller
		}
		release <- struct{}{}
	}
	done := make(chan struct{}, 1)
	viaFn := func() {
		c := s.Get()
		c.Dst, c.Fn = make([]byte, 4), func(*Call) { done <- struct{}{} }
		require.NoError(t, s.Send(c, make([]byte, 8), nil))
		answerLate()
		<-done
	}
	// The caller is parked in Wait before its answer leaves: one that
	// came after the reader had read it (a loaded machine can delay it
	// that long) was never parked, so the reader would wake no one.
	viaWait := func() {
		c := send(t, s, make([]byte, 4))
		waited := make(chan error, 1)
		go func() { waited <- c.Wait(context.Background()) }()
		require.Eventually(t, func() bool { return c.signal.Load() == sigParked }, 5*time.Second, 100*time.Microsecond)
		answerLate()
		require.NoError(t, <-waited)
	}

	// A caller that calls Wait after its response was read was never
	// parked: there is no one to wake, and the reader keeps poll(2).
	viaLateWait := func() {
		c := send(t, s, make([]byte, 4))
		release <- struct{}{}
		require.Eventually(t, func() bool { return c.signal.Load() == sigDone }, 5*time.Second, time.Millisecond)
		require.NoError(t, c.Wait(context.Background()))
	}

	viaFn() // the reader has read once and is drained
	for _, tc := range []struct {
		name string
		call func()
		poll bool
	}{
		{"Fn", viaFn, true},
		{"first Wait (the reader woke no one before it)", viaWait, true},
		{"Wait after Wait", viaWait, false},
		{"Fn after Wait", viaFn, false},
		{"Fn after Fn", viaFn, true},
		{"Wait that came late", viaLateWait, true},
		{"Fn after a Wait that came late", viaFn, true},
	} {
		before := s.fast.Wakeups.Load()
		poll = tc.poll
		tc.call()
		if tc.poll {
			assert.Greater(t, s.fast.Wakeups.Load(), before, "%s: the reader did not wait in poll(2)", tc.name)
		} else {
			assert.Equal(t, before, s.fast.Wakeups.Load(), "%s: the reader held its P in poll(2) after waking a caller", tc.name)
		}
	}
}

// A session counts itself in its Busy while it has calls in flight, so
// that the readers of other connections do not wait in poll(2) meanwhile
// (sockio.Busy.Await), and stops counting when the calls are answered or
// the connection breaks.
func TestSessionCountsItselfAwaitedWhileCallsAreInFlight(t *testing.T) {
	var busy sockio.Busy
	cl, sv := tcpPair(t)
	release := make(chan struct{})
	toyServer(t, sv, release)
	s := New(cl, toy{}, Options{Busy: &busy})
	defer s.Close(io.EOF)
	assert.Zero(t, busy.Awaited())
	a, b := send(t, s, make([]byte, 4)), send(t, s, make([]byte, 4))
	assert.Equal(t, 1, busy.Awaited(), "one connection, two calls")
	release <- struct{}{}
	require.NoError(t, a.Wait(context.Background()))
	assert.Equal(t, 1, busy.Awaited(), "a call still in flight")
	release <- struct{}{}
	require.NoError(t, b.Wait(context.Background()))
	assert.Zero(t, busy.Awaited())
	c := send(t, s, make([]byte, 4))
	assert.Equal(t, 1, busy.Awaited())
	sv.Close()
	assert.Error(t, c.Wait(context.Background()))
	assert.Zero(t, busy.Awaited(), "a broken connection awaits nothing")
}
