package pageproto

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/sockio"
	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type rig struct {
	node  *memnode.Client // direct view of the memory node
	store *pagestore.Store
	addr  string
	vol   pageid.VolumeInfo
}

// newRig starts memnode → pagestore (cachePages frames) → page server.
func newRig(t *testing.T, cachePages int, volPages uint64) *rig {
	t.Helper()
	ctx := context.Background()
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	msrv := &memnode.Server{Store: memnode.NewStore(0)}
	go msrv.Serve(ctx, mln)
	mc, err := memnode.Dial(ctx, mln.Addr().String(), memnode.ClientOptions{})
	require.NoError(t, err)
	vol, err := mc.Create(ctx, "disk0", volPages*pageid.Size)
	require.NoError(t, err)
	st, err := pagestore.New(memnode.Remote{C: mc}, pagestore.Options{CacheBytes: int64(cachePages) * pageid.Size})
	require.NoError(t, err)
	st.AddVolume(vol)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &Server{Backend: st, Workers: 4, Log: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	go srv.Serve(ctx, ln)
	direct, err := memnode.Dial(ctx, mln.Addr().String(), memnode.ClientOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		srv.Close()
		assert.NoError(t, st.Check())
		direct.Close()
		mc.Close()
		msrv.Close()
		assert.NoError(t, msrv.Store.Check())
	})
	return &rig{node: direct, store: st, addr: ln.Addr().String(), vol: vol}
}

func pageOf(k pageid.Key, version uint64) []byte {
	p := make([]byte, pageid.Size)
	for i := 0; i < pageid.Size; i += 16 {
		binary.LittleEndian.PutUint64(p[i:], uint64(k))
		binary.LittleEndian.PutUint64(p[i+8:], version)
	}
	return p
}

// TestModelConcurrentClients: several clients, each pipelining batches of
// GET/PUT on its own pages and issuing SYNCs, are checked against an exact
// model; after every SYNC the memory node itself must hold the model.
func TestModelConcurrentClients(t *testing.T) {
	const clients, volPages, rounds, batch = 4, 1024, 150, 16
	r := newRig(t, 32, volPages)
	base := testutil.Seed(t)
	var wg sync.WaitGroup
	for ci := 0; ci < clients; ci++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(base, uint64(ci)))
			c, err := Dial(ctx, r.addr, ClientOptions{})
			if !assert.NoError(t, err) {
				return
			}
			defer c.Close()
			model := make(map[pageid.Key][]byte)
			bufs := make([][]byte, batch)
			for i := range bufs {
				bufs[i] = make([]byte, pageid.Size)
			}
			for round := 0; round < rounds; round++ {
				if rng.IntN(10) == 0 {
					if !assert.NoError(t, c.Sync(ctx)) {
						return
					}
					got := make([]byte, pageid.Size)
					for k, want := range model {
						assert.NoError(t, r.node.ReadAt(ctx, k.Volume(), k.Page()*pageid.Size, got))
						if !assert.Equal(t, want, got, "memory node lacks synced page %v", k) {
							return
						}
					}
					continue
				}
				// A batch of distinct pages owned by this client, in flight together.
				seen := make(map[pageid.Key]bool)
				calls := make([]Call, 0, batch)
				kinds := make([]bool, 0, batch)
				keys := make([]pageid.Key, 0, batch)
				for len(calls) < batch {
					k := pageid.MakeKey(r.vol.ID, uint64(rng.IntN(volPages/clients)*clients+ci))
					if seen[k] {
						continue
					}
					seen[k] = true
					if rng.IntN(2) == 0 {
						p := pageOf(k, uint64(round*batch+len(calls)+1))
						calls = append(calls, c.PutAsync(k, p))
						model[k] = p
						kinds = append(kinds, true)
					} else {
						calls = append(calls, c.GetAsync(k, bufs[len(calls)]))
						kinds = append(kinds, false)
					}
					keys = append(keys, k)
				}
				for i, call := range calls {
					if !assert.NoError(t, call.Wait(ctx)) {
						return
					}
					if !kinds[i] {
						want, ok := model[keys[i]]
						if !ok {
							want = make([]byte, pageid.Size)
						}
						if !assert.Equal(t, want, bufs[i], "GET %v, round %d", keys[i], round) {
							return
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	assert.Greater(t, r.store.Stats().Evictions, uint64(500), "the cache must be under pressure")
}

func TestErrorsAndBadFrames(t *testing.T) {
	r := newRig(t, 16, 64)
	ctx := context.Background()
	good, err := Dial(ctx, r.addr, ClientOptions{})
	require.NoError(t, err)
	defer good.Close()
	buf := make([]byte, pageid.Size)

	assert.ErrorIs(t, good.Get(ctx, pageid.MakeKey(r.vol.ID, 64), buf), pageid.ErrOutOfRange)
	assert.ErrorIs(t, good.Get(ctx, pageid.MakeKey(99, 0), buf), pageid.ErrNoVolume)
	assert.ErrorIs(t, good.Put(ctx, pageid.MakeKey(r.vol.ID, 1<<40), buf), pageid.ErrOutOfRange)

	raw := func() net.Conn {
		nc, err := net.Dial("tcp", r.addr)
		require.NoError(t, err)
		t.Cleanup(func() { nc.Close() })
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		return nc
	}
	// Unknown op: answered, connection kept.
	nc := raw()
	var hb [HeaderSize]byte
	(&Header{Op: 77, Tag: 5}).EncodeRequest(hb[:])
	nc.Write(hb[:])
	(&Header{Op: OpGet, Tag: 6, ID: pageid.MakeKey(r.vol.ID, 0)}).EncodeRequest(hb[:])
	nc.Write(hb[:])
	var rb [HeaderSize + pageid.Size]byte
	_, err = io.ReadFull(nc, rb[:HeaderSize])
	require.NoError(t, err)
	var h Header
	require.NoError(t, h.DecodeResponse(rb[:]))
	if h.Tag == 5 {
		assert.Equal(t, StatusUnknownOp, h.Status)
	} else {
		assert.Equal(t, StatusOK, h.Status)
	}

	for name, frame := range map[string][]byte{
		"bad magic": {0x99, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		"flags":     {ReqMagic, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		"truncated": {ReqMagic, 2, 0, 0},
		"short PUT": append([]byte{ReqMagic, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0}, make([]byte, 100)...),
	} {
		t.Run(name, func(t *testing.T) {
			nc := raw()
			nc.Write(frame)
			nc.(*net.TCPConn).CloseWrite()
			_, err := io.ReadAll(nc)
			assert.NoError(t, err, "server closes the connection")
			assert.NoError(t, good.Get(ctx, pageid.MakeKey(r.vol.ID, 1), buf), "other clients keep working")
		})
	}
}

// TestMemnodeDownGivesIO: with the memory node gone, misses fail with an I/O
// status promptly instead of hanging.
func TestMemnodeDownGivesIO(t *testing.T) {
	ctx := context.Background()
	mln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	msrv := &memnode.Server{Store: memnode.NewStore(0)}
	go msrv.Serve(ctx, mln)
	mc, err := memnode.Dial(ctx, mln.Addr().String(), memnode.ClientOptions{DialTimeout: time.Second})
	require.NoError(t, err)
	defer mc.Close()
	vol, err := mc.Create(ctx, "disk0", 64*pageid.Size)
	require.NoError(t, err)
	st, err := pagestore.New(memnode.Remote{C: mc}, pagestore.Options{CacheBytes: 16 * pageid.Size})
	require.NoError(t, err)
	st.AddVolume(vol)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &Server{Backend: st}
	go srv.Serve(ctx, ln)
	defer srv.Close()
	c, err := Dial(ctx, ln.Addr().String(), ClientOptions{})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Put(ctx, pageid.MakeKey(vol.ID, 1), pageOf(1, 1)))
	msrv.Close()
	start := time.Now()
	buf := make([]byte, pageid.Size)
	assert.ErrorIs(t, c.Get(ctx, pageid.MakeKey(vol.ID, 2), buf), ErrIO)
	assert.ErrorIs(t, c.Sync(ctx), ErrIO, "the dirty page cannot reach the node")
	assert.Less(t, time.Since(start), 10*time.Second)
	// The cached, unsynced write is still served.
	require.NoError(t, c.Get(ctx, pageid.MakeKey(vol.ID, 1), buf))
	assert.Equal(t, pageOf(1, 1), buf)
}

// VOLUMES lists what the server serves, so clients can say which ids exist.
func TestVolumesListsServedVolumes(t *testing.T) {
	r := newRig(t, 16, 64)
	ctx := context.Background()
	c, err := Dial(ctx, r.addr, ClientOptions{})
	require.NoError(t, err)
	defer c.Close()
	vs, more, err := c.Volumes(ctx)
	require.NoError(t, err)
	assert.False(t, more)
	assert.Equal(t, []pageid.VolumeInfo{r.vol}, vs)
}

func TestVolumesEncodingTruncates(t *testing.T) {
	var vs []pageid.VolumeInfo
	for i := 0; i < 400; i++ {
		vs = append(vs, pageid.VolumeInfo{ID: uint16(i), Size: uint64(i) << 12, Name: "fs.pd3.volume-with-a-long-name"})
	}
	page := make([]byte, pageid.Size)
	assert.False(t, EncodeVolumes(page, vs), "400 long names do not fit a page")
	got, more, err := DecodeVolumes(page)
	require.NoError(t, err)
	assert.True(t, more)
	assert.Equal(t, vs[:len(got)], got)
	assert.Greater(t, len(got), 90)
}

// A page client that reaches an NBD server by mistake says so.
func TestClientNamesTheWrongServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		// An NBD server's greeting: NBDMAGIC, IHAVEOPT, handshake flags.
		nc.Write(append([]byte("NBDMAGICIHAVEOPT"), 0, 3))
		io.Copy(io.Discard, nc)
	}()
	ctx := context.Background()
	c, err := Dial(ctx, ln.Addr().String(), ClientOptions{OpTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer c.Close()
	err = c.Get(ctx, pageid.MakeKey(1, 0), make([]byte, pageid.Size))
	require.ErrorIs(t, err, ErrFraming)
	assert.ErrorContains(t, err, "this looks like an NBD server, not a page server")
}

// gateBackend holds every GET until release is closed.
type gateBackend struct{ release chan struct{} }

func (g gateBackend) Get(ctx context.Context, _ pageid.Key, _ []byte) error {
	<-g.release
	return nil
}
func (gateBackend) Put(context.Context, pageid.Key, []byte) error { return nil }
func (gateBackend) Flush(context.Context) error                   { return nil }

// Busy counts each request from its header being read to its reply being
// queued, on every connection: the memory-node reader that consults it
// must see the server's load (sockio.Reader.DirectIf).
func TestBusyCountsRequestsInFlight(t *testing.T) {
	ctx := context.Background()
	g := gateBackend{release: make(chan struct{})}
	var busy sockio.Busy
	srv := &Server{Backend: g, Workers: 4, Busy: &busy}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(ctx, ln)
	t.Cleanup(func() { srv.Close() })
	var calls []Call
	for range 2 {
		c, err := Dial(ctx, ln.Addr().String(), ClientOptions{})
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		for p := range 2 {
			calls = append(calls, c.GetAsync(pageid.MakeKey(1, uint64(p)), make([]byte, pageid.Size)))
		}
	}
	require.Eventually(t, func() bool { return busy.Count() == 4 }, 5*time.Second, time.Millisecond,
		"four GETs held by the backend, %d counted", busy.Count())
	assert.False(t, busy.Lone())
	close(g.release)
	for _, c := range calls {
		require.NoError(t, c.Wait(ctx))
	}
	// A reply can reach the client just before its worker uncounts it.
	assert.Eventually(t, func() bool { return busy.Count() == 0 }, 5*time.Second, time.Millisecond,
		"answered requests still counted: %d", busy.Count())
}
