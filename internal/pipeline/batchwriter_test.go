package pipeline

import (
	"encoding/binary"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/testnet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func tcpPair(t *testing.T) (a, b net.Conn) { return testnet.Pair(t, "tcp", "127.0.0.1:0") }

// within fails the test if fn does not return in d: a deadlock detector,
// not a timing assertion (fn takes microseconds when it works).
func within(t *testing.T, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { fn(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s: still blocked after %v (deadlock)", what, d)
	}
}

func TestLoneFrameIsWrittenInline(t *testing.T) {
	a, b := tcpPair(t)
	bw := NewBatchWriter(a, 1<<20, nil)
	defer bw.Close()
	for i := 0; i < 10; i++ {
		buf, err := bw.Begin()
		require.NoError(t, err)
		bw.End(append(buf, byte(i)))
		var got [1]byte
		_, err = io.ReadFull(b, got[:])
		require.NoError(t, err)
		require.Equal(t, byte(i), got[0])
	}
	// Nothing else was writing, so every frame left on its producer's
	// goroutine: no hand-off to the writer goroutine.
	assert.Equal(t, uint64(10), bw.Inline.Load())
	assert.Equal(t, uint64(10), bw.Writes.Load())
}

// Frames held back with EndLater past MaxPending must not block the next
// Begin forever: before the fix, the memory node stopped answering under
// fio Q8T8 with 75 requests outstanding.
func TestHeldBackFramesDoNotDeadlockBegin(t *testing.T) {
	a, b := tcpPair(t)
	go io.Copy(io.Discard, b)
	bw := NewBatchWriter(a, 4096, nil)
	defer bw.Close()
	frame := make([]byte, 1500)
	within(t, 10*time.Second, "Begin after EndLater past MaxPending", func() {
		for i := 0; i < 100; i++ {
			buf, err := bw.Begin()
			require.NoError(t, err)
			bw.EndLater(append(buf, frame...))
		}
		bw.Flush()
	})
	within(t, 10*time.Second, "TryBegin after EndLater past MaxPending", func() {
		for i := 0; i < 100; {
			buf, ok, err := bw.TryBegin()
			require.NoError(t, err)
			if ok {
				bw.EndLater(append(buf, frame...))
				i++
			}
		}
		bw.Flush()
	})
}

// A peer that does not read fills the socket; producers must not block on
// it (the memnode client's completions call End), the writer goroutine
// takes the tail, and every byte arrives in order once the peer reads.
func TestFullSocketIsHandedToTheWriterGoroutine(t *testing.T) {
	a, b := tcpPair(t)
	bw := NewBatchWriter(a, 64<<20, nil)
	const frames, size = 2000, 4096 // 8 MiB: more than the socket holds
	within(t, 20*time.Second, "End on a full socket", func() {
		for i := 0; i < frames; i++ {
			buf, err := bw.Begin()
			require.NoError(t, err)
			f := make([]byte, size)
			binary.LittleEndian.PutUint32(f, uint32(i))
			bw.End(append(buf, f...))
		}
	})
	got := make([]byte, size)
	for i := 0; i < frames; i++ {
		_, err := io.ReadFull(b, got)
		require.NoError(t, err)
		require.Equal(t, uint32(i), binary.LittleEndian.Uint32(got), "frame %d out of order", i)
	}
	bw.Close()
	assert.Less(t, bw.Inline.Load(), bw.Writes.Load(), "the goroutine wrote the tail")
}

// Concurrent producers mixing End, EndLater+Flush and TryBegin: every
// frame arrives whole and each producer's frames in its order.
func TestConcurrentProducersKeepOrder(t *testing.T) {
	a, b := tcpPair(t)
	bw := NewBatchWriter(a, 32<<10, nil)
	const producers, per = 8, 5000
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				var f [8]byte
				binary.LittleEndian.PutUint32(f[:], uint32(p))
				binary.LittleEndian.PutUint32(f[4:], uint32(i))
				switch i % 3 {
				case 0:
					buf, err := bw.Begin()
					require.NoError(t, err)
					bw.End(append(buf, f[:]...))
				case 1:
					buf, err := bw.Begin()
					require.NoError(t, err)
					bw.EndLater(append(buf, f[:]...))
					bw.Flush()
				default:
					for {
						buf, ok, err := bw.TryBegin()
						require.NoError(t, err)
						if ok {
							bw.End(append(buf, f[:]...))
							break
						}
						runtime.Gosched()
					}
				}
			}
		}()
	}
	next := make([]uint32, producers)
	done := make(chan error, 1)
	go func() {
		var f [8]byte
		for n := 0; n < producers*per; n++ {
			if _, err := io.ReadFull(b, f[:]); err != nil {
				done <- err
				return
			}
			p, i := binary.LittleEndian.Uint32(f[:]), binary.LittleEndian.Uint32(f[4:])
			if p >= producers || i != next[p] {
				done <- io.ErrUnexpectedEOF
				return
			}
			next[p]++
		}
		done <- nil
	}()
	wg.Wait()
	select {
	case err := <-done:
		require.NoError(t, err, "frames lost, torn or reordered")
	case <-time.After(20 * time.Second):
		t.Fatal("frames did not all arrive (a batch was never written)")
	}
	bw.Close()
}

// Acknowledgements of a burst of mutations (the memory node's WRITE acks)
// are held until the producer's Flush and leave in one write, behind one
// gate wait for the newest token: not one syscall per acknowledgement.
func TestTokenFramesWaitForFlushAndOneGate(t *testing.T) {
	for _, gated := range []bool{false, true} {
		a, b := tcpPair(t)
		bw := NewBatchWriter(a, 1<<20, nil)
		var gates []uint64
		var mu sync.Mutex
		if gated {
			bw.SetGate(func(tok uint64) error {
				mu.Lock()
				gates = append(gates, tok)
				mu.Unlock()
				return nil
			})
		}
		for i := 1; i <= 3; i++ {
			buf, err := bw.Begin()
			require.NoError(t, err)
			bw.EndTokenLater(append(buf, byte(i)), uint64(i))
		}
		assert.Zero(t, bw.Writes.Load(), "gated=%v: nothing leaves before Flush", gated)
		bw.Flush()
		var got [3]byte
		_, err := io.ReadFull(b, got[:])
		require.NoError(t, err)
		assert.Equal(t, [3]byte{1, 2, 3}, got)
		bw.Close()
		assert.Equal(t, uint64(1), bw.Writes.Load(), "gated=%v: one write for the burst", gated)
		if gated {
			assert.Equal(t, []uint64{3}, gates)
		}
	}
}

// A lone frame with a large payload leaves in one writev, the payload not
// copied; one held back by EndLater leaves first, in order. The payload
// buffer is the caller's again once EndPayload returns: overwritten then,
// what arrives is still what was sent.
func TestEndPayloadWritesBesideTheHeader(t *testing.T) {
	a, b := tcpPair(t)
	bw := NewBatchWriter(a, 1<<20, nil)
	defer bw.Close()
	payload := make([]byte, 128<<10)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	want := append([]byte("head"), payload...)
	buf, err := bw.Begin()
	require.NoError(t, err)
	bw.EndPayload(append(buf, "head"...), payload, 1)
	got := make([]byte, len(want))
	_, err = io.ReadFull(b, got)
	require.NoError(t, err)
	require.Equal(t, want, got)
	assert.Equal(t, uint64(1), bw.Writes.Load(), "header and payload in one write")

	buf, err = bw.Begin()
	require.NoError(t, err)
	bw.EndLater(append(buf, "first"...))
	buf, err = bw.Begin()
	require.NoError(t, err)
	bw.EndPayload(append(buf, "head"...), payload, 1)
	clear(payload)
	got = make([]byte, 5+len(want))
	_, err = io.ReadFull(b, got)
	require.NoError(t, err)
	require.Equal(t, append([]byte("first"), want...), got)
	assert.Equal(t, uint64(2), bw.Writes.Load())
}

// A peer that does not read: what the socket does not take of a payload
// written beside its header is copied and written by the goroutine, in
// order with the frames after it, and the producer never blocks.
func TestEndPayloadOnAFullSocket(t *testing.T) {
	a, b := tcpPair(t)
	bw := NewBatchWriter(a, 64<<20, nil)
	const frames, size = 200, 64 << 10 // 12.5 MiB: more than the socket holds
	within(t, 20*time.Second, "EndPayload on a full socket", func() {
		p := make([]byte, size)
		for i := 0; i < frames; i++ {
			buf, err := bw.Begin()
			require.NoError(t, err)
			for j := range p {
				p[j] = byte(i + j)
			}
			bw.EndPayload(binary.LittleEndian.AppendUint32(buf, uint32(i)), p, 1)
		}
	})
	got := make([]byte, 4+size)
	for i := 0; i < frames; i++ {
		_, err := io.ReadFull(b, got)
		require.NoError(t, err)
		require.Equal(t, uint32(i), binary.LittleEndian.Uint32(got), "frame %d out of order", i)
		for j := range size {
			if got[4+j] != byte(i+j) {
				t.Fatalf("frame %d: byte %d is %d, want %d", i, j, got[4+j], byte(i+j))
			}
		}
	}
	bw.Close()
	assert.Less(t, bw.Inline.Load(), bw.Writes.Load(), "the goroutine wrote the tail")
}
