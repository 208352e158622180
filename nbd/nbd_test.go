package nbd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/pipeline"
	"github.com/pd3-go/pd3/internal/procgov"
	"github.com/pd3-go/pd3/internal/sockio"
	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/nbd/nbdproto"
	"github.com/pd3-go/pd3/pagestore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type rig struct {
	addr  string
	mc    *memnode.Client // the page store's client
	node  *memnode.Client // direct view of the memory node
	mem   *memnode.Store  // the node's memory, for accounting checks
	store *pagestore.Store
	srv   *Server
}

func (r *rig) srvStoreUsed() uint64 { return r.mem.Used() }

// newRig serves volumes disk0 (size bytes) and ro (1 MiB, read-only) over
// NBD from a memory node through a cache of cache bytes.
// newRig serves a volume "disk0" of size bytes and a read-only "ro". The
// configure functions run before Serve: a Server's fields must not change
// once it serves.
func newRig(t *testing.T, size uint64, cache int64, configure ...func(*Server)) *rig {
	t.Helper()
	ctx := context.Background()
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	msrv := &memnode.Server{Store: memnode.NewStore(0)}
	go msrv.Serve(ctx, mln)
	cork := new(pipeline.Cork) // as a host wires it
	mc, err := memnode.Dial(ctx, mln.Addr().String(), memnode.ClientOptions{Cork: cork})
	require.NoError(t, err)
	direct, err := memnode.Dial(ctx, mln.Addr().String(), memnode.ClientOptions{})
	require.NoError(t, err)
	st, err := pagestore.New(memnode.Remote{C: mc}, pagestore.Options{CacheBytes: cache})
	require.NoError(t, err)
	srv := &Server{Backend: st, Cork: cork}
	for _, v := range []struct {
		name string
		size uint64
		ro   bool
	}{{"disk0", size, false}, {"ro", 1 << 20, true}} {
		vi, err := mc.Create(ctx, v.name, v.size)
		require.NoError(t, err)
		st.AddVolume(vi)
		srv.Exports = append(srv.Exports, Export{Name: v.name, Volume: vi.ID, Size: vi.Size, ReadOnly: v.ro, Description: "test " + v.name})
	}
	for _, f := range configure {
		f(srv)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(ctx, ln)
	t.Cleanup(func() {
		srv.Close()
		assert.NoError(t, st.Check())
		direct.Close()
		mc.Close()
		msrv.Close()
	})
	return &rig{addr: ln.Addr().String(), mc: mc, node: direct, mem: msrv.Store, store: st, srv: srv}
}

func (r *rig) uri(export string) string { return "nbd://" + r.addr + "/" + export }

func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (apt-get install fio libnbd-bin nbdkit qemu-utils; .ci/run does)", tool)
		}
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	require.NoError(t, err, "%s %v:\n%s", name, args, out)
	return string(out)
}

// --- a minimal client, for what real clients will not send ---

type client struct {
	nc    net.Conn
	r     *bufio.Reader
	size  uint64
	flags nbdproto.TFlags
}

func dial(t *testing.T, addr, export string, structured bool) *client {
	t.Helper()
	c := dialRaw(t, addr)
	if structured {
		c.option(t, nbdproto.OptStructuredReply, nil)
		typ, _ := c.optReply(t)
		require.Equal(t, nbdproto.RepAck, typ)
	}
	d := binary.BigEndian.AppendUint32(nil, uint32(len(export)))
	d = append(d, export...)
	d = binary.BigEndian.AppendUint16(d, 0)
	c.option(t, nbdproto.OptGo, d)
	for {
		typ, data := c.optReply(t)
		if typ == nbdproto.RepAck {
			break
		}
		require.Equal(t, nbdproto.RepInfo, typ, "GO failed: %s", data)
		if nbdproto.Info(binary.BigEndian.Uint16(data)) == nbdproto.InfoExport {
			c.size = binary.BigEndian.Uint64(data[2:])
			c.flags = nbdproto.TFlags(binary.BigEndian.Uint16(data[10:]))
		}
	}
	c.nc.SetDeadline(time.Time{})
	return c
}

// dialRaw connects and sends the client flags; the options are the
// test's.
func dialRaw(t *testing.T, addr string) *client {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	c := &client{nc: nc, r: bufio.NewReader(nc)}
	var g [nbdproto.GreetingLen]byte
	_, err = io.ReadFull(c.r, g[:])
	require.NoError(t, err)
	require.Equal(t, nbdproto.MagicInit, binary.BigEndian.Uint64(g[0:]))
	require.Equal(t, nbdproto.MagicOption, binary.BigEndian.Uint64(g[8:]))
	_, err = nc.Write(binary.BigEndian.AppendUint32(nil, uint32(nbdproto.ClientFixedNewstyle|nbdproto.ClientNoZeroes)))
	require.NoError(t, err)
	return c
}

// setConn goes on over nc (a TLS connection over the old one).
func (c *client) setConn(nc net.Conn) { c.nc, c.r = nc, bufio.NewReader(nc) }

func (c *client) option(t *testing.T, opt nbdproto.Opt, data []byte) {
	_, err := c.nc.Write(nbdproto.AppendOption(nil, opt, data))
	require.NoError(t, err)
}

func (c *client) optReply(t *testing.T) (nbdproto.Rep, []byte) {
	var h [20]byte
	_, err := io.ReadFull(c.r, h[:])
	require.NoError(t, err)
	require.Equal(t, nbdproto.MagicOptReply, binary.BigEndian.Uint64(h[0:]))
	n := binary.BigEndian.Uint32(h[16:])
	require.LessOrEqual(t, n, uint32(64<<10), "option reply length from the server")
	data := make([]byte, n)
	_, err = io.ReadFull(c.r, data)
	require.NoError(t, err)
	return nbdproto.Rep(binary.BigEndian.Uint32(h[12:])), data
}

func (c *client) send(typ nbdproto.Cmd, flags nbdproto.CmdFlags, cookie, off uint64, length uint32, payload []byte) {
	r := nbdproto.Request{Cmd: typ, Flags: flags, Cookie: cookie, Offset: off, Length: length}
	c.nc.Write(append(r.Append(nil), payload...))
}

// simple reads one simple reply (plus n bytes of data when errno is 0).
func (c *client) simple(t *testing.T, n int) (errno nbdproto.Errno, cookie uint64, data []byte) {
	t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var h [16]byte
	_, err := io.ReadFull(c.r, h[:])
	require.NoError(t, err)
	require.Equal(t, nbdproto.MagicSimpleReply, binary.BigEndian.Uint32(h[0:]))
	errno, cookie = nbdproto.Errno(binary.BigEndian.Uint32(h[4:])), binary.BigEndian.Uint64(h[8:])
	if errno == 0 && n > 0 {
		data = make([]byte, n)
		_, err = io.ReadFull(c.r, data)
		require.NoError(t, err)
	}
	return errno, cookie, data
}

func (c *client) closed(t *testing.T) bool {
	c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.Copy(io.Discard, c.r)
	return err == nil // EOF: the server hung up
}

// --- protocol tests ---

func TestReadWriteFlushTrimZeroes(t *testing.T) {
	r := newRig(t, 8<<20, 32*4096)
	c := dial(t, r.addr, "", false)
	assert.Equal(t, uint64(8<<20), c.size, "the empty name is the default export")
	want := nbdproto.TFHasFlags | nbdproto.TFSendFlush | nbdproto.TFSendFUA | nbdproto.TFSendTrim | nbdproto.TFSendWriteZeros | nbdproto.TFCanMultiConn | nbdproto.TFSendCache | nbdproto.TFSendFastZero
	assert.Equal(t, want, c.flags)

	data := make([]byte, 10000)
	for i := range data {
		data[i] = byte(i*7 + 1)
	}
	c.send(nbdproto.CmdWrite, nbdproto.CmdFlagFUA, 1, 777, uint32(len(data)), data)
	errno, cookie, _ := c.simple(t, 0)
	require.Zero(t, errno)
	assert.Equal(t, uint64(1), cookie)
	// FUA: it is at the memory node now.
	at := make([]byte, len(data))
	require.NoError(t, r.node.ReadAt(context.Background(), 1, 777, at))
	assert.Equal(t, data, at)

	c.send(nbdproto.CmdRead, 0, 2, 777, uint32(len(data)), nil)
	errno, _, got := c.simple(t, len(data))
	require.Zero(t, errno)
	assert.Equal(t, data, got)

	c.send(nbdproto.CmdWriteZeroes, nbdproto.CmdFlagNoHole, 3, 1000, 3000, nil)
	errno, _, _ = c.simple(t, 0)
	require.Zero(t, errno)
	c.send(nbdproto.CmdTrim, 0, 4, 4096, 2*4096, nil) // pages 1-2 entirely
	errno, _, _ = c.simple(t, 0)
	require.Zero(t, errno)
	copy(data[1000-777:], make([]byte, 3000))
	for i := 4096 - 777; i < 3*4096-777 && i < len(data); i++ {
		data[i] = 0
	}
	c.send(nbdproto.CmdRead, 0, 5, 777, uint32(len(data)), nil)
	_, _, got = c.simple(t, len(data))
	assert.Equal(t, data, got)

	c.send(nbdproto.CmdFlush, 0, 6, 0, 0, nil)
	errno, _, _ = c.simple(t, 0)
	assert.Zero(t, errno)
	c.send(nbdproto.CmdCache, 0, 7, 0, 1<<20, nil)
	errno, _, _ = c.simple(t, 0)
	assert.Zero(t, errno)
	c.send(nbdproto.CmdDisc, 0, 8, 0, 0, nil)
	assert.True(t, c.closed(t))
}

func TestStructuredReadAndErrors(t *testing.T) {
	r := newRig(t, 1<<20, 32*4096)
	c := dial(t, r.addr, "disk0", true)
	assert.NotZero(t, c.flags&nbdproto.TFSendDF)
	c.send(nbdproto.CmdRead, nbdproto.CmdFlagDF, 9, 100, 50, nil)
	var h [20]byte
	_, err := io.ReadFull(c.r, h[:])
	require.NoError(t, err)
	assert.Equal(t, nbdproto.MagicStructuredReply, binary.BigEndian.Uint32(h[0:]))
	assert.Equal(t, nbdproto.ChunkFlagDone, binary.BigEndian.Uint16(h[4:]))
	assert.Equal(t, nbdproto.ChunkOffsetData, nbdproto.Chunk(binary.BigEndian.Uint16(h[6:])))
	assert.Equal(t, uint64(9), binary.BigEndian.Uint64(h[8:]))
	n := binary.BigEndian.Uint32(h[16:])
	require.Equal(t, uint32(58), n)
	payload := make([]byte, n)
	io.ReadFull(c.r, payload)
	assert.Equal(t, uint64(100), binary.BigEndian.Uint64(payload))

	// A read past the end is an error chunk; the connection goes on.
	c.send(nbdproto.CmdRead, 0, 10, 1<<20-10, 20, nil)
	io.ReadFull(c.r, h[:])
	assert.Equal(t, nbdproto.ChunkError, nbdproto.Chunk(binary.BigEndian.Uint16(h[6:])))
	payload = make([]byte, binary.BigEndian.Uint32(h[16:]))
	io.ReadFull(c.r, payload)
	assert.Equal(t, nbdproto.EINVAL, nbdproto.Errno(binary.BigEndian.Uint32(payload)))
	c.send(nbdproto.CmdFlush, 0, 11, 0, 0, nil)
	errno, cookie, _ := c.simple(t, 0)
	assert.Zero(t, errno)
	assert.Equal(t, uint64(11), cookie)
}

// TestMalformedRequests: each bad request gets its error (or its
// connection closed) while another client keeps working, and is counted
// as served only until then.
func TestMalformedRequests(t *testing.T) {
	var busy sockio.Busy
	r := newRig(t, 1<<20, 32*4096, func(s *Server) { s.Busy = &busy })
	good := dial(t, r.addr, "disk0", false)
	check := func(t *testing.T) {
		t.Helper()
		// Every request is uncounted once answered, refused or dropped
		// with its connection, or the memory-node reader would think the
		// host busy for good (sockio.Reader.DirectIf).
		assert.Eventually(t, func() bool { return busy.Count() == 0 }, 5*time.Second, time.Millisecond,
			"requests still counted as served: %d", busy.Count())
		good.send(nbdproto.CmdRead, 0, 42, 0, 4096, nil)
		errno, cookie, _ := good.simple(t, 4096)
		require.Zero(t, errno)
		require.Equal(t, uint64(42), cookie)
	}
	errs := []struct {
		name         string
		typ          nbdproto.Cmd
		flags        nbdproto.CmdFlags
		off          uint64
		length       uint32
		payload      []byte
		export       string
		errno        nbdproto.Errno
		structured   bool
		replyPayload int
	}{
		{"unknown command", 99, 0, 0, 4096, nil, "disk0", nbdproto.EINVAL, false, 0},
		{"unknown flag", nbdproto.CmdRead, 1 << 9, 0, 4096, nil, "disk0", nbdproto.EINVAL, false, 0},
		{"DF without structured replies", nbdproto.CmdRead, nbdproto.CmdFlagDF, 0, 4096, nil, "disk0", nbdproto.EINVAL, false, 0},
		{"zero-length read", nbdproto.CmdRead, 0, 0, 0, nil, "disk0", nbdproto.EINVAL, false, 0},
		{"read past end", nbdproto.CmdRead, 0, 1 << 20, 1, nil, "disk0", nbdproto.EINVAL, false, 0},
		{"offset overflow", nbdproto.CmdRead, 0, ^uint64(0) - 10, 4096, nil, "disk0", nbdproto.EINVAL, false, 0},
		{"write past end", nbdproto.CmdWrite, 0, 1<<20 - 1, 2, []byte{1, 2}, "disk0", nbdproto.ENOSPC, false, 0},
		{"huge read", nbdproto.CmdRead, 0, 0, 64 << 20, nil, "disk0", nbdproto.EOVERFLOW, false, 0},
		{"huge write", nbdproto.CmdWrite, 0, 0, 33 << 20, make([]byte, 33<<20), "disk0", nbdproto.EOVERFLOW, false, 0},
		{"flush with a length", nbdproto.CmdFlush, 0, 0, 1, nil, "disk0", nbdproto.EINVAL, false, 0},
		{"block status without a context", nbdproto.CmdBlockStatus, 0, 0, 4096, nil, "disk0", nbdproto.EINVAL, false, 0},
		{"write to read-only", nbdproto.CmdWrite, 0, 0, 4, []byte{1, 2, 3, 4}, "ro", nbdproto.EPERM, false, 0},
		{"trim read-only", nbdproto.CmdTrim, 0, 0, 4096, nil, "ro", nbdproto.EPERM, false, 0},
		{"fast zero that must allocate", nbdproto.CmdWriteZeroes, nbdproto.CmdFlagNoHole | nbdproto.CmdFlagFastZero, 0, 4096, nil, "disk0", nbdproto.ENOTSUP, false, 0},
	}
	for _, tc := range errs {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, r.addr, tc.export, tc.structured)
			c.send(tc.typ, tc.flags, 7, tc.off, tc.length, tc.payload)
			errno, cookie, _ := c.simple(t, tc.replyPayload)
			assert.Equal(t, tc.errno, errno)
			assert.Equal(t, uint64(7), cookie)
			// The connection still works.
			c.send(nbdproto.CmdFlush, 0, 8, 0, 0, nil)
			errno, _, _ = c.simple(t, 0)
			assert.Zero(t, errno)
			check(t)
		})
	}
	for _, tc := range []struct {
		name string
		raw  []byte
	}{
		{"bad magic", bytes.Repeat([]byte{0xee}, nbdproto.RequestHeaderLen)},
		{"truncated header", []byte{0x25, 0x60, 0x95, 0x13, 0, 0}},
		{"write longer than 64 MiB", func() []byte {
			var h [nbdproto.RequestHeaderLen]byte
			binary.BigEndian.PutUint32(h[0:], nbdproto.MagicRequest)
			binary.BigEndian.PutUint16(h[6:], uint16(nbdproto.CmdWrite))
			binary.BigEndian.PutUint32(h[24:], 1<<30)
			return h[:]
		}()},
	} {
		t.Run(tc.name+" closes only that connection", func(t *testing.T) {
			c := dial(t, r.addr, "disk0", false)
			c.nc.Write(tc.raw)
			c.nc.(*net.TCPConn).CloseWrite()
			assert.True(t, c.closed(t))
			check(t)
		})
	}
	t.Run("unknown export in GO", func(t *testing.T) {
		nc, err := net.Dial("tcp", r.addr)
		require.NoError(t, err)
		defer nc.Close()
		c := &client{nc: nc, r: bufio.NewReader(nc)}
		io.ReadFull(c.r, make([]byte, 18))
		nc.Write(binary.BigEndian.AppendUint32(nil, uint32(nbdproto.ClientFixedNewstyle)))
		d := binary.BigEndian.AppendUint32(nil, 4)
		d = append(d, "nope"...)
		c.option(t, nbdproto.OptGo, binary.BigEndian.AppendUint16(d, 0))
		typ, msg := c.optReply(t)
		assert.Equal(t, nbdproto.RepErrUnknown, typ)
		assert.Contains(t, string(msg), `no export "nope"; this server exports "disk0"`, "the message names the exports")
		c.option(t, 4242, []byte("x"))
		typ, _ = c.optReply(t)
		assert.Equal(t, nbdproto.RepErrUnsup, typ, "unknown options are refused, not fatal")
		c.option(t, nbdproto.OptAbort, nil)
		typ, _ = c.optReply(t)
		assert.Equal(t, nbdproto.RepAck, typ)
	})
	t.Run("idle client times out", func(t *testing.T) {
		srv := &Server{Backend: r.store, Exports: r.srv.Exports, HandshakeTimeout: 200 * time.Millisecond}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		go srv.Serve(context.Background(), ln)
		defer srv.Close()
		nc, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		defer nc.Close()
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = io.Copy(io.Discard, nc)
		assert.NoError(t, err, "the server hung up on a silent client")
	})
}

// TestMultiConnFlush: a FLUSH on one connection makes writes acknowledged
// on another durable at the memory node.
func TestMultiConnFlush(t *testing.T) {
	r := newRig(t, 1<<20, 64*4096)
	a := dial(t, r.addr, "disk0", false)
	b := dial(t, r.addr, "disk0", false)
	p := bytes.Repeat([]byte{0x5a}, 4096)
	a.send(nbdproto.CmdWrite, 0, 1, 8192, 4096, p)
	errno, _, _ := a.simple(t, 0)
	require.Zero(t, errno)
	b.send(nbdproto.CmdFlush, 0, 2, 0, 0, nil)
	errno, _, _ = b.simple(t, 0)
	require.Zero(t, errno)
	got := make([]byte, 4096)
	require.NoError(t, r.node.ReadAt(context.Background(), 1, 8192, got))
	assert.Equal(t, p, got)
}

// TestConcurrentRequestsOutOfOrder pipelines many requests on one
// connection; every cookie is answered once with the right data.
func TestConcurrentRequestsOutOfOrder(t *testing.T) {
	r := newRig(t, 4<<20, 16*4096)
	c := dial(t, r.addr, "disk0", false)
	const n = 200
	for i := uint64(0); i < n; i++ {
		p := bytes.Repeat([]byte{byte(i)}, 4096)
		c.send(nbdproto.CmdWrite, 0, i, i*4096, 4096, p)
	}
	seen := map[uint64]bool{}
	for i := 0; i < n; i++ {
		errno, cookie, _ := c.simple(t, 0)
		require.Zero(t, errno)
		require.False(t, seen[cookie])
		seen[cookie] = true
	}
	for i := uint64(0); i < n; i++ {
		c.send(nbdproto.CmdRead, 0, 1000+i, i*4096, 4096, nil)
	}
	for i := 0; i < n; i++ {
		errno, cookie, data := c.simple(t, 4096)
		require.Zero(t, errno)
		assert.Equal(t, bytes.Repeat([]byte{byte(cookie - 1000)}, 4096), data)
	}
}

// TestABurstOfMissesLeavesInOneWrite: a burst of READs the connection
// reads at once holds the cork until the reader runs out of requests, so
// that their misses leave for the memory node in one write, not one each
// (docs/decisions.md, 48).
//
// With a second connection open no reader holds it: their holds would
// hold each other's requests.
func TestABurstOfMissesLeavesInOneWrite(t *testing.T) {
	for _, tc := range []struct {
		corked bool
		conns  int
	}{{true, 1}, {false, 1}, {true, 2}} {
		corked := tc.corked && tc.conns == 1
		t.Run(fmt.Sprintf("cork=%v,conns=%d", tc.corked, tc.conns), func(t *testing.T) {
			r := newRig(t, 4<<20, 64*4096, func(s *Server) {
				if !tc.corked {
					s.Cork = nil
				}
			})
			c := dial(t, r.addr, "disk0", false)
			if tc.conns == 2 {
				dial(t, r.addr, "disk0", false)
				require.Eventually(t, func() bool { return r.srv.transmittingConns.Load() == 2 }, 5*time.Second, time.Millisecond, "the second connection transmitting")
			}
			const n = 16
			before := r.mc.RequestWrites()
			var burst []byte
			for i := range uint64(n) {
				burst = (&nbdproto.Request{Cmd: nbdproto.CmdRead, Cookie: i, Offset: i * 4096, Length: 4096}).Append(burst)
			}
			_, err := c.nc.Write(burst)
			require.NoError(t, err)
			for range n {
				errno, _, _ := c.simple(t, 4096)
				require.Zero(t, errno)
			}
			assert.Equal(t, uint64(n), r.store.Stats().Misses, "every read a miss")
			writes := r.mc.RequestWrites() - before
			if corked {
				assert.Equal(t, uint64(1), writes, "writes carrying the burst's %d misses", n)
			} else {
				assert.Greater(t, writes, uint64(1), "unheld, the first miss leaves alone")
			}
		})
	}
}

// TestClientNotReadingStallsNobody: one-page reads are finished on the
// memory-node client's reader goroutine, shared by every connection. A
// client that floods READs and never reads the replies must only stall
// itself: another connection's misses keep being served.
func TestClientNotReadingStallsNobody(t *testing.T) {
	const pages = 8192
	r := newRig(t, pages*4096, 64*4096)
	a := dial(t, r.addr, "disk0", false)
	go func() {
		for i := uint64(0); i < 6000; i++ {
			a.send(nbdproto.CmdRead, 0, i, (i%pages)*4096, 4096, nil)
		}
	}()
	// Let a's replies fill its socket and reply buffer, until the server
	// stops reading a's requests.
	last := uint64(0)
	require.Eventually(t, func() bool {
		n := r.srv.Requests.Load()
		stuck := n == last && n > 1000
		last = n
		return stuck
	}, 10*time.Second, 200*time.Millisecond)
	t.Logf("the server read %d of a's requests before it stopped", last)
	b := dial(t, r.addr, "disk0", false)
	start := time.Now()
	for i := uint64(0); i < 50; i++ {
		b.send(nbdproto.CmdRead, 0, i, ((i*97+4000)%pages)*4096, 4096, nil)
		errno, cookie, _ := b.simple(t, 4096)
		require.Zero(t, errno)
		require.Equal(t, i, cookie)
	}
	t.Logf("50 misses on the second connection in %v", time.Since(start))
	// a gets every reply once it reads.
	seen := 0
	for seen < 6000 {
		errno, _, _ := a.simple(t, 4096)
		require.Zero(t, errno)
		seen++
	}
}

// --- real clients ---

func TestNbdinfo(t *testing.T) {
	need(t, "nbdinfo")
	r := newRig(t, 64<<20, 1<<20)
	var info struct {
		Exports []map[string]any `json:"exports"`
	}
	require.NoError(t, json.Unmarshal([]byte(run(t, "nbdinfo", "--json", r.uri("disk0"))), &info))
	require.Len(t, info.Exports, 1)
	e := info.Exports[0]
	for _, k := range []string{"can_flush", "can_fua", "can_trim", "can_zero", "can_multi_conn", "can_cache", "can_fast_zero", "can_df"} {
		assert.Equal(t, true, e[k], k)
	}
	assert.Equal(t, false, e["is_read_only"])
	assert.EqualValues(t, 64<<20, e["export-size"])
	assert.EqualValues(t, 1, e["block_size_minimum"])
	assert.EqualValues(t, 4096, e["block_size_preferred"])
	assert.EqualValues(t, 32<<20, e["block_size_maximum"])

	require.NoError(t, json.Unmarshal([]byte(run(t, "nbdinfo", "--json", r.uri("ro"))), &info))
	assert.Equal(t, true, info.Exports[0]["is_read_only"])
	assert.Equal(t, false, info.Exports[0]["can_trim"])

	list := run(t, "nbdinfo", "--list", "nbd://"+r.addr)
	assert.Contains(t, list, `export="disk0"`)
	assert.Contains(t, list, `export="ro"`)
	assert.Contains(t, list, "base:allocation")
}

func TestNbdcopyRoundTrip(t *testing.T) {
	need(t, "nbdcopy")
	const size = 64 << 20 // four times the cache
	r := newRig(t, size, 16<<20)
	dir := t.TempDir()
	img := filepath.Join(dir, "in.img")
	buf := make([]byte, size)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(buf); i += 8 {
		binary.LittleEndian.PutUint64(buf[i:], rng.Uint64())
	}
	require.NoError(t, os.WriteFile(img, buf, 0o600))
	run(t, "nbdcopy", img, r.uri("disk0"))
	out := filepath.Join(dir, "out.img")
	run(t, "nbdcopy", r.uri("disk0"), out)
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, sha256.Sum256(buf), sha256.Sum256(got), "checksums differ")
}

func TestQemuIOUnaligned(t *testing.T) {
	need(t, "qemu-io")
	r := newRig(t, 16<<20, 8*4096)
	u := r.uri("disk0")
	out := run(t, "qemu-io", "-f", "raw", u,
		"-c", "write -P 0xab 1234 5000",
		"-c", "write -P 0xcd 4095 2",
		"-c", "write -P 0x11 1048575 300000",
		"-c", "read -P 0xab 1234 2861",
		"-c", "read -P 0xcd 4095 2",
		"-c", "read -P 0xab 4097 1137",
		"-c", "read -P 0x11 1048575 300000",
		"-c", "read -P 0 0 1234",
		"-c", "flush")
	assert.NotContains(t, out, "failed")
	assert.NotContains(t, out, "error")
	// Out of range is refused by qemu-io or by us, never hangs or corrupts.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o, _ := exec.CommandContext(ctx, "qemu-io", "-f", "raw", u, "-c", fmt.Sprintf("read %d 4096", 16<<20)).CombinedOutput()
	assert.Contains(t, string(o), "rror", "reading past the end fails")
}

func TestFioVerify(t *testing.T) {
	need(t, "fio")
	r := newRig(t, 128<<20, 16<<20)
	job, err := filepath.Abs("../tools/fio/verify.fio")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "fio", job)
	cmd.Env = append(os.Environ(), "NBD_URI="+r.uri("disk0"))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "err= 0")
	assert.NotContains(t, string(out), "verify: bad")
}

// TestTrimFreesChunks: TRIM of whole chunks over NBD gives the memory
// back at the node; a later read sees zeroes.
func TestTrimFreesChunks(t *testing.T) {
	r := newRig(t, 8<<20, 16*4096)
	c := dial(t, r.addr, "disk0", false)
	for off := uint64(0); off < 8<<20; off += 1 << 20 {
		c.send(nbdproto.CmdWrite, nbdproto.CmdFlagFUA, off, off, 1<<20, bytes.Repeat([]byte{7}, 1<<20))
		errno, _, _ := c.simple(t, 0)
		require.Zero(t, errno)
	}
	used := r.srvStoreUsed
	before := used()
	require.GreaterOrEqual(t, before, uint64(8<<20))
	c.send(nbdproto.CmdTrim, nbdproto.CmdFlagFUA, 1, 1<<20, 4<<20, nil) // chunks 1-4
	errno, _, _ := c.simple(t, 0)
	require.Zero(t, errno)
	assert.Equal(t, before-4<<20, used(), "4 whole chunks freed at the memory node")
	c.send(nbdproto.CmdRead, 0, 2, 2<<20, 4096, nil)
	errno, _, data := c.simple(t, 4096)
	require.Zero(t, errno)
	assert.Equal(t, make([]byte, 4096), data)
	c.send(nbdproto.CmdRead, 0, 3, 5<<20, 4096, nil)
	_, _, data = c.simple(t, 4096)
	assert.Equal(t, bytes.Repeat([]byte{7}, 4096), data, "untrimmed data stays")
}

// After the reader hands a request to a worker (a WRITE) its next wait for
// input is in the network poller, not poll(2): the worker is queued on the
// reader's P, which a thread blocked in poll(2) would keep. Requests the
// reader answers itself (a one-page READ) keep the poll(2) wait. Each
// request comes late enough that the reader is waiting for it; poll(2)'s
// returns are counted.
func TestReaderLeavesItsPToTheWorkerItHandedARequest(t *testing.T) {
	conns := make(chan *conn, 1)
	var busy sockio.Busy // one connection: lone, and a gauge of readers in poll(2)
	r := newRig(t, 1<<20, 32*4096, func(s *Server) {
		s.transmitting = func(c *conn) { conns <- c }
		s.Busy = &busy
	})
	c := dial(t, r.addr, "disk0", false)
	sc := <-conns
	require.NotNil(t, sc.fast)

	cookie := uint64(0)
	late := func(typ nbdproto.Cmd, flags nbdproto.CmdFlags, payload []byte, poll bool) {
		t.Helper()
		if poll {
			require.Eventually(t, func() bool { return busy.Polls() > 0 }, 10*time.Second, 50*time.Microsecond,
				"the reader waits in poll(2)")
		} else {
			testutil.LetPark() // in the network poller
		}
		cookie++
		off, n, reply := uint64(4096), uint32(len(payload)), 0
		switch typ {
		case nbdproto.CmdRead:
			n, reply = 4096, 4096
		case nbdproto.CmdFlush:
			off = 0 // a FLUSH has neither offset nor length
		}
		c.send(typ, flags, cookie, off, n, payload)
		errno, got, _ := c.simple(t, reply)
		require.Zero(t, errno)
		require.Equal(t, cookie, got)
	}
	late(nbdproto.CmdRead, 0, nil, true) // the reader is drained: its next read waits
	// A WRITE with FUA goes to a worker (it waits for a write-back); one
	// without, of a page the cache can take at once, is written by the
	// reader itself (writePage). One page each: the reader may wait in
	// poll(2) for the rest of a request it is still reading (a payload of
	// more than one loopback segment), which hands nothing to anyone.
	fua := nbdproto.CmdFlagFUA
	for _, tc := range []struct {
		name  string
		typ   nbdproto.Cmd
		flags nbdproto.CmdFlags
		pages int
		poll  bool
	}{
		{"READ", nbdproto.CmdRead, 0, 0, true},
		{"FUA WRITE after a READ", nbdproto.CmdWrite, fua, 1, true},
		{"READ after a FUA WRITE", nbdproto.CmdRead, 0, 0, false},
		{"READ after a READ", nbdproto.CmdRead, 0, 0, true},
		{"FLUSH", nbdproto.CmdFlush, 0, 0, true},
		{"FUA WRITE after a FLUSH", nbdproto.CmdWrite, fua, 1, false},
		{"one-page WRITE after a FUA WRITE", nbdproto.CmdWrite, 0, 1, false},
		{"READ after a one-page WRITE", nbdproto.CmdRead, 0, 0, true},
	} {
		payload := bytes.Repeat([]byte{7}, tc.pages*4096)
		before := sc.fast.Wakeups.Load()
		late(tc.typ, tc.flags, payload, tc.poll)
		if tc.poll {
			assert.Greater(t, sc.fast.Wakeups.Load(), before, "%s: the reader did not wait in poll(2)", tc.name)
		} else {
			assert.Equal(t, before, sc.fast.Wakeups.Load(), "%s: the reader held its P in poll(2) after handing a request to a worker", tc.name)
		}
	}
}

// TestLoneHitsDropToOneP: a run of reads answered from the cache one at a
// time on the only connection takes the process to one P; a write or a
// second connection brings every P back, and a miss breaks the run.
func TestLoneHitsDropToOneP(t *testing.T) {
	var mu sync.Mutex
	var calls []int
	gov := procgov.NewWith(1, 2, func(n int) int {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, n)
		return 0
	})
	switches := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(calls)
	}
	r := newRig(t, 1<<20, 32*4096, func(s *Server) { s.Procs = gov; s.Busy = new(sockio.Busy) })
	c := dial(t, r.addr, "disk0", false)
	cookie := uint64(0)
	do := func(typ nbdproto.Cmd, page uint64, payload []byte) {
		t.Helper()
		cookie++
		n, reply := uint32(len(payload)), 0
		if typ == nbdproto.CmdRead {
			n, reply = 4096, 4096
		}
		c.send(typ, 0, cookie, page*4096, n, payload)
		errno, got, _ := c.simple(t, reply)
		require.Zero(t, errno)
		require.Equal(t, cookie, got)
	}
	do(nbdproto.CmdRead, 3, nil) // a miss loads it
	for range procgov.HitsBeforeLow - 1 {
		do(nbdproto.CmdRead, 3, nil)
	}
	assert.Empty(t, switches(), "not before a run of lone hits")
	do(nbdproto.CmdRead, 3, nil)
	assert.Equal(t, []int{1}, switches(), "one P after the run")
	do(nbdproto.CmdWrite, 3, bytes.Repeat([]byte{1}, 4096))
	assert.Equal(t, []int{1, 2}, switches(), "a write brings every P back")

	for range procgov.HitsBeforeLow - 1 {
		do(nbdproto.CmdRead, 3, nil)
	}
	do(nbdproto.CmdRead, 200, nil) // a miss breaks the run
	do(nbdproto.CmdRead, 3, nil)
	assert.Equal(t, []int{1, 2}, switches(), "a miss resets the run")
	// Back up right after going low: the next run must be twice as long.
	for range 2 * procgov.HitsBeforeLow {
		do(nbdproto.CmdRead, 3, nil)
	}
	assert.Equal(t, []int{1, 2, 1}, switches())

	// A second connection brings every P back, and while it is open no
	// hit is lone.
	dial(t, r.addr, "disk0", false)
	require.Eventually(t, func() bool { return len(switches()) == 4 }, 5*time.Second, time.Millisecond)
	for range 8 * procgov.HitsBeforeLow {
		do(nbdproto.CmdRead, 3, nil)
	}
	assert.Equal(t, []int{1, 2, 1, 2}, switches())
}

// A second client connection makes the host never lone: with two, each
// reader would wait in poll(2) holding a P while the other's miss needs
// one (sockio.Busy.AddConn). The count follows connections as they come
// and go.
func TestTwoConnectionsAreNeverLone(t *testing.T) {
	var busy sockio.Busy
	r := newRig(t, 1<<20, 32*4096, func(s *Server) { s.Busy = &busy })
	read := func(c *client) {
		t.Helper()
		c.send(nbdproto.CmdRead, 0, 1, 0, 4096, nil)
		errno, _, _ := c.simple(t, 4096)
		require.Zero(t, errno)
	}
	a := dial(t, r.addr, "disk0", false)
	read(a)
	assert.True(t, busy.Lone(), "one connection, nothing in flight")
	b := dial(t, r.addr, "disk0", false)
	read(b)
	assert.False(t, busy.Lone(), "two connections")
	b.nc.Close()
	assert.Eventually(t, busy.Lone, 5*time.Second, time.Millisecond, "the second connection's end is counted")
	read(a)
}
