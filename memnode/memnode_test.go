package memnode

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/pipeline"
	"github.com/pd3-go/pd3/pageid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startNode runs a node on a loopback port and checks its store at cleanup.
func startNode(t testing.TB, token string, capacity uint64) (*Server, string) {
	t.Helper()
	srv := &Server{Store: NewStore(capacity), Token: token}
	return srv, serveT(t, srv)
}

// serveT serves srv on a loopback port until the test ends, then checks
// its store, and returns the address.
func serveT(t testing.TB, srv *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	if srv.HandshakeTimeout == 0 {
		srv.HandshakeTimeout = 2 * time.Second
	}
	go srv.Serve(context.Background(), ln)
	t.Cleanup(func() {
		srv.Close()
		assert.NoError(t, srv.Store.Check())
	})
	return ln.Addr().String()
}

func dialT(t testing.TB, addr, token string) *Client {
	t.Helper()
	c, err := Dial(context.Background(), addr, ClientOptions{Token: token, OpTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func TestReadWriteZeroesAndVolumes(t *testing.T) {
	_, addr := startNode(t, "", 0)
	c := dialT(t, addr, "")
	ctx := context.Background()

	v, err := c.Create(ctx, "disk0", 3*ChunkSize+100)
	require.NoError(t, err)
	assert.Equal(t, uint64(3*ChunkSize+pageid.Size), v.Size, "size rounds up to a page")
	_, err = c.Create(ctx, "disk0", 1)
	assert.ErrorIs(t, err, pageid.ErrExists)

	page := make([]byte, pageid.Size)
	require.NoError(t, c.ReadAt(ctx, v.ID, 0, page))
	assert.Equal(t, make([]byte, pageid.Size), page, "unwritten pages read as zeroes")

	// A write that straddles a chunk boundary.
	data := bytes.Repeat([]byte{0xab}, 3*pageid.Size)
	off := uint64(ChunkSize - pageid.Size)
	require.NoError(t, c.WriteAt(ctx, v.ID, off, data))
	got := make([]byte, len(data))
	require.NoError(t, c.ReadAt(ctx, v.ID, off, got))
	assert.Equal(t, data, got)

	require.NoError(t, c.Prefetch(ctx, pageid.MakeKey(v.ID, off/pageid.Size), page))
	assert.Equal(t, data[:pageid.Size], page)

	o, err := c.Open(ctx, "disk0")
	require.NoError(t, err)
	assert.Equal(t, uint64(2*ChunkSize), o.Stored, "the straddling write allocated two chunks")

	// Trim of a whole chunk frees it; a partial trim zeroes.
	require.NoError(t, c.Trim(ctx, v.ID, ChunkSize, ChunkSize))
	require.NoError(t, c.ReadAt(ctx, v.ID, off, got))
	assert.Equal(t, data[:pageid.Size], got[:pageid.Size])
	assert.Equal(t, make([]byte, 2*pageid.Size), got[pageid.Size:])

	old, err := c.FetchAndAdd(ctx, v.ID, 64, 5)
	require.NoError(t, err)
	assert.Zero(t, old)
	old, err = c.CompareAndSwap(ctx, v.ID, 64, 5, 9)
	require.NoError(t, err)
	assert.Equal(t, uint64(5), old)
	old, err = c.CompareAndSwap(ctx, v.ID, 64, 5, 11)
	require.NoError(t, err)
	assert.Equal(t, uint64(9), old, "failed CAS returns the current value")

	list, err := c.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, "disk0", list[0].Name)
	assert.Equal(t, uint64(ChunkSize), list[0].Stored, "the trimmed chunk is no longer stored")
	o, err = c.Open(ctx, "disk0")
	require.NoError(t, err)
	v.Stored = ChunkSize
	assert.Equal(t, v, o)
	require.NoError(t, c.Delete(ctx, "disk0"))
	_, err = c.Open(ctx, "disk0")
	assert.ErrorIs(t, err, pageid.ErrNoVolume)
}

func TestTypedErrors(t *testing.T) {
	_, addr := startNode(t, "secret", 2*ChunkSize)
	c := dialT(t, addr, "secret")
	ctx := context.Background()
	v, err := c.Create(ctx, "small", 8*ChunkSize)
	require.NoError(t, err)
	buf := make([]byte, pageid.Size)
	tests := []struct {
		name string
		err  error
		run  func() error
	}{
		{"read past end", pageid.ErrOutOfRange, func() error { return c.ReadAt(ctx, v.ID, v.Size-10, buf) }},
		{"write past end", pageid.ErrOutOfRange, func() error { return c.WriteAt(ctx, v.ID, v.Size, buf) }},
		{"offset overflow", pageid.ErrOutOfRange, func() error { return c.ReadAt(ctx, v.ID, ^uint64(0)-10, buf) }},
		{"no volume", pageid.ErrNoVolume, func() error { return c.ReadAt(ctx, 999, 0, buf) }},
		{"too large", ErrTooLarge, func() error { return c.ReadAt(ctx, v.ID, 0, make([]byte, MaxIO+1)) }},
		{"misaligned", ErrMisaligned, func() error { _, err := c.FetchAndAdd(ctx, v.ID, 3, 1); return err }},
		{"bad name", ErrBadRequest, func() error { _, err := c.Create(ctx, "a/b", 10); return err }},
		{"no memory", pageid.ErrNoMemory, func() error {
			for i := uint64(0); i < 3; i++ {
				if err := c.WriteAt(ctx, v.ID, i*ChunkSize, buf); err != nil {
					return err
				}
			}
			return nil
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.ErrorIs(t, tt.run(), tt.err)
		})
	}
	// The connection survived every per-request error.
	require.NoError(t, c.ReadAt(ctx, v.ID, 0, buf))
}

func TestWrongTokenAndVersion(t *testing.T) {
	_, addr := startNode(t, "secret", 0)
	_, err := Dial(context.Background(), addr, ClientOptions{Token: "guess"})
	assert.ErrorIs(t, err, ErrUnauthorised)

	// Raw: a request before HELLO is refused and the connection closed.
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer nc.Close()
	var hdr [ReqHeaderSize]byte
	(&ReqHeader{Op: OpRead, Volume: 1, Count: 8, Tag: 7}).Encode(hdr[:])
	_, err = nc.Write(hdr[:])
	require.NoError(t, err)
	rh := readResp(t, nc)
	assert.Equal(t, StatusUnauthorised, rh.Status)
	assert.Equal(t, uint64(7), rh.Tag)
	assertClosed(t, nc)

	// A wrong version.
	nc2, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer nc2.Close()
	sendHello(t, nc2, 99, "secret")
	assert.Equal(t, StatusVersion, readResp(t, nc2).Status)
}

func sendHello(t *testing.T, nc net.Conn, version uint32, token string) {
	t.Helper()
	p := binary.LittleEndian.AppendUint32(nil, version)
	p = append(p, token...)
	var hdr [ReqHeaderSize]byte
	(&ReqHeader{Op: OpHello, PayloadLen: uint32(len(p))}).Encode(hdr[:])
	_, err := nc.Write(append(hdr[:], p...))
	require.NoError(t, err)
}

// bindRaw sends a BIND of window key on vol: length bytes at off (0: to
// the end) with access.
func bindRaw(t *testing.T, nc net.Conn, vol uint16, key uint32, off, length uint64, access uint32) {
	t.Helper()
	var hdr [ReqHeaderSize]byte
	(&ReqHeader{Op: OpBind, Volume: vol, Offset: off, Window: key, PayloadLen: bindPayloadSize}).Encode(hdr[:])
	var p [bindPayloadSize]byte
	binary.LittleEndian.PutUint64(p[:], length)
	binary.LittleEndian.PutUint32(p[8:], access)
	_, err := nc.Write(append(hdr[:], p[:]...))
	require.NoError(t, err)
}

func readResp(t *testing.T, nc net.Conn) RespHeader {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [RespHeaderSize]byte
	_, err := io.ReadFull(nc, b[:])
	require.NoError(t, err)
	var h RespHeader
	require.NoError(t, h.Decode(b[:]))
	_, err = io.CopyN(io.Discard, nc, int64(h.PayloadLen))
	require.NoError(t, err)
	return h
}

func assertClosed(t *testing.T, nc net.Conn) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := nc.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "server should close the connection")
}

// TestBadFramesIsolated sends broken frames on raw connections while a
// well-behaved client keeps working.
func TestBadFramesIsolated(t *testing.T) {
	_, addr := startNode(t, "", 0)
	good := dialT(t, addr, "")
	ctx := context.Background()
	v, err := good.Create(ctx, "v", ChunkSize)
	require.NoError(t, err)

	raw := func(t *testing.T) net.Conn {
		nc, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { nc.Close() })
		sendHello(t, nc, Version, "")
		require.Equal(t, StatusOK, readResp(t, nc).Status)
		bindRaw(t, nc, v.ID, 1, 0, 0, AccessAll)
		require.Equal(t, StatusOK, readResp(t, nc).Status)
		return nc
	}
	t.Run("unknown op answers and keeps the connection", func(t *testing.T) {
		nc := raw(t)
		var hdr [ReqHeaderSize]byte
		(&ReqHeader{Op: 200, Tag: 1, PayloadLen: 3}).Encode(hdr[:])
		nc.Write(append(hdr[:], 1, 2, 3))
		assert.Equal(t, StatusUnknownOp, readResp(t, nc).Status)
		(&ReqHeader{Op: OpRead, Volume: v.ID, Tag: 2, Count: 16, Window: 1}).Encode(hdr[:])
		nc.Write(hdr[:])
		rh := readResp(t, nc)
		assert.Equal(t, StatusOK, rh.Status)
		assert.Equal(t, uint64(2), rh.Tag)
	})
	t.Run("oversized READ is per request", func(t *testing.T) {
		nc := raw(t)
		var hdr [ReqHeaderSize]byte
		(&ReqHeader{Op: OpRead, Volume: v.ID, Tag: 1, Count: MaxIO + 1, Window: 1}).Encode(hdr[:])
		nc.Write(hdr[:])
		assert.Equal(t, StatusTooLarge, readResp(t, nc).Status)
	})
	for _, tc := range []struct {
		name  string
		frame func() []byte
	}{
		{"bad magic", func() []byte { b := make([]byte, ReqHeaderSize); b[0] = 0x42; return b }},
		{"oversized payload", func() []byte {
			var hdr [ReqHeaderSize]byte
			(&ReqHeader{Op: OpWrite, Volume: v.ID, PayloadLen: MaxPayload + 1}).Encode(hdr[:])
			return hdr[:]
		}},
	} {
		t.Run(tc.name+" closes only that connection", func(t *testing.T) {
			nc := raw(t)
			nc.Write(tc.frame())
			// Best-effort error response, then EOF.
			nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			rest, _ := io.ReadAll(nc)
			assert.LessOrEqual(t, len(rest), RespHeaderSize)
			require.NoError(t, good.ReadAt(ctx, v.ID, 0, make([]byte, 8)))
		})
	}
	t.Run("truncated header then hang-up", func(t *testing.T) {
		nc := raw(t)
		nc.Write(make([]byte, 10))
		nc.Close()
		require.NoError(t, good.ReadAt(ctx, v.ID, 0, make([]byte, 8)))
	})
}

// TestRestartFailsCleanly kills the node under a client with requests in
// flight: they fail with pageid.ErrUnavailable promptly, and the client redials once a
// node listens again.
func TestRestartFailsCleanly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	srv := &Server{Store: NewStore(0)}
	go srv.Serve(context.Background(), ln)
	c := dialT(t, addr, "")
	ctx := context.Background()
	v, err := c.Create(ctx, "v", 64*ChunkSize)
	require.NoError(t, err)

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	stop := make(chan struct{})
	var wrote atomic.Int64
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, pageid.Size)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := c.WriteAt(ctx, v.ID, uint64(i)*pageid.Size, buf); err != nil {
					errs <- err
					return
				}
				wrote.Add(1)
			}
		}()
	}
	require.Eventually(t, func() bool { return wrote.Load() >= 100 }, 10*time.Second, time.Millisecond, "writes under way")
	srv.Close()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("clients hang after the memory node died")
	}
	close(stop)
	close(errs)
	n := 0
	for err := range errs {
		n++
		assert.ErrorIs(t, err, pageid.ErrUnavailable)
	}
	assert.Equal(t, 8, n)

	// Restart on the same address: the client redials; the volume is gone
	// because memory-node memory is volatile.
	ln2, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	srv2 := &Server{Store: NewStore(0)}
	go srv2.Serve(context.Background(), ln2)
	defer srv2.Close()
	err = c.ReadAt(ctx, v.ID, 0, make([]byte, 8))
	assert.ErrorIs(t, err, pageid.ErrNoVolume)
}

// TestSilentNodeTimesOut: a node that accepts but never answers makes
// requests fail after OpTimeout instead of hanging.
func TestSilentNodeTimesOut(t *testing.T) {
	fake, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer fake.Close()
	go func() {
		nc, err := fake.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		// Answer HELLO, then swallow everything and never answer.
		var hdr [ReqHeaderSize]byte
		io.ReadFull(nc, hdr[:])
		var h ReqHeader
		h.Decode(hdr[:])
		io.CopyN(io.Discard, nc, int64(h.PayloadLen))
		var rb [RespHeaderSize + 8]byte
		(&RespHeader{Op: OpHello, Tag: h.Tag, PayloadLen: 8}).Encode(rb[:])
		nc.Write(rb[:])
		io.Copy(io.Discard, nc)
	}()
	c, err := Dial(context.Background(), fake.Addr().String(), ClientOptions{OpTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	defer c.Close()
	start := time.Now()
	err = c.ReadAt(context.Background(), 1, 0, make([]byte, 8))
	assert.ErrorIs(t, err, pageid.ErrUnavailable)
	assert.ErrorIs(t, err, pipeline.ErrTimeout)
	assert.Less(t, time.Since(start), 5*time.Second)
}

// TestResize grows volumes of every table shape over the wire while
// another connection reads and writes them: what was written stays, the
// new bytes read as zeroes and take writes, and shrinking is refused.
func TestResize(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from, to uint64
	}{
		{"within a chunk", 2 * pageid.Size, 8 * pageid.Size},
		{"more chunks", 3 * ChunkSize, 7*ChunkSize + pageid.Size},
		{"dense to sparse", 2 * ChunkSize, denseChunks*ChunkSize + 5*ChunkSize},
		{"sparse", (denseChunks + 1) * ChunkSize, 1 << 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, addr := startNode(t, "", 0)
			c, busy := dialT(t, addr, ""), dialT(t, addr, "")
			ctx := context.Background()
			v, err := c.Create(ctx, "v", tc.from)
			require.NoError(t, err)
			first := pattern(1, pageid.Size)
			require.NoError(t, c.WriteAt(ctx, v.ID, 0, first))

			// Reads and writes of the old range go on through the resize.
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				got := make([]byte, pageid.Size)
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if err := busy.WriteAt(ctx, v.ID, tc.from-pageid.Size, pattern(byte(i), pageid.Size)); err != nil {
						t.Error(err)
						return
					}
					if err := busy.ReadAt(ctx, v.ID, 0, got); err != nil || !bytes.Equal(got, first) {
						t.Errorf("first page during the resize: %v", err)
						return
					}
				}
			}()
			_, err = c.Resize(ctx, "v", tc.from-pageid.Size)
			assert.ErrorIs(t, err, ErrBadRequest, "shrinking")
			info, err := c.Resize(ctx, "v", tc.to)
			close(stop)
			wg.Wait()
			require.NoError(t, err)
			assert.Equal(t, tc.to, info.Size)
			o, err := c.Open(ctx, "v")
			require.NoError(t, err)
			assert.Equal(t, tc.to, o.Size)

			got := make([]byte, pageid.Size)
			require.NoError(t, c.ReadAt(ctx, v.ID, 0, got))
			assert.Equal(t, first, got)
			last := tc.to - pageid.Size
			require.NoError(t, c.ReadAt(ctx, v.ID, tc.from, got))
			assert.Equal(t, make([]byte, pageid.Size), got, "the new bytes")
			require.NoError(t, c.WriteAt(ctx, v.ID, last, pattern(9, pageid.Size)))
			require.NoError(t, c.ReadAt(ctx, v.ID, last, got))
			assert.Equal(t, pattern(9, pageid.Size), got)
			assert.ErrorIs(t, c.ReadAt(ctx, v.ID, tc.to, got), pageid.ErrOutOfRange)
			_, err = c.Resize(ctx, "v", tc.to) // the same size: nothing to do
			require.NoError(t, err)
		})
	}
	t.Run("no such volume", func(t *testing.T) {
		_, addr := startNode(t, "", 0)
		_, err := dialT(t, addr, "").Resize(context.Background(), "nope", pageid.Size)
		assert.ErrorIs(t, err, pageid.ErrNoVolume)
	})
}
