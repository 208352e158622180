package memnode

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/pageid"
)

// rawConn is a hand-driven connection for checking what the node answers
// to requests a Client would never send.
type rawConn struct {
	t   *testing.T
	nc  net.Conn
	tag uint64
}

func dialRaw(t *testing.T, addr, token string) *rawConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	sendHello(t, nc, Version, token)
	require.Equal(t, StatusOK, readResp(t, nc).Status)
	return &rawConn{t: t, nc: nc}
}

// do sends one request and returns the response's status and payload.
func (r *rawConn) do(h ReqHeader, payload []byte) (Status, []byte) {
	r.t.Helper()
	r.tag++
	h.Tag, h.PayloadLen = r.tag, uint32(len(payload))
	var hdr [ReqHeaderSize]byte
	h.Encode(hdr[:])
	_, err := r.nc.Write(append(hdr[:], payload...))
	require.NoError(r.t, err)
	r.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [RespHeaderSize]byte
	_, err = io.ReadFull(r.nc, b[:])
	require.NoError(r.t, err)
	var rh RespHeader
	require.NoError(r.t, rh.Decode(b[:]))
	require.Equal(r.t, r.tag, rh.Tag)
	p := make([]byte, rh.PayloadLen)
	_, err = io.ReadFull(r.nc, p)
	require.NoError(r.t, err)
	return rh.Status, p
}

func (r *rawConn) bind(vol uint16, key uint32, off, length uint64, access uint32) Status {
	var p [bindPayloadSize]byte
	binary.LittleEndian.PutUint64(p[:], length)
	binary.LittleEndian.PutUint32(p[8:], access)
	st, _ := r.do(ReqHeader{Op: OpBind, Volume: vol, Offset: off, Window: key}, p[:])
	return st
}

// TestWindowKeysArePerConnection: a window key grants only on the
// connection that bound it, only the bytes and access it was bound with,
// and nothing once unbound; refusals are per request.
func TestWindowKeysArePerConnection(t *testing.T) {
	_, addr := startNode(t, "", 0)
	ctx := context.Background()
	c := dialT(t, addr, "")
	v, err := c.Create(ctx, "v", ChunkSize)
	require.NoError(t, err)
	w, err := c.Create(ctx, "w", ChunkSize)
	require.NoError(t, err)
	page := bytes.Repeat([]byte{0xab}, pageid.Size)
	// The client's first request bound window 1 on its own connection.
	require.NoError(t, c.WriteAt(ctx, v.ID, 0, page))

	r := dialRaw(t, addr, "")
	read := func(vol uint16, key uint32, off uint64, n uint32) Status {
		st, _ := r.do(ReqHeader{Op: OpRead, Volume: vol, Offset: off, Count: n, Window: key}, nil)
		return st
	}
	assert.Equal(t, StatusNoWindow, read(v.ID, 1, 0, 8), "the client's key on another connection")
	assert.Equal(t, StatusNoWindow, read(v.ID, 0, 0, 8), "no key")

	require.Equal(t, StatusOK, r.bind(v.ID, 1, 0, pageid.Size, AccessRead))
	st, got := r.do(ReqHeader{Op: OpRead, Volume: v.ID, Count: pageid.Size, Window: 1}, nil)
	require.Equal(t, StatusOK, st)
	assert.Equal(t, page, got)

	var word [16]byte
	tests := []struct {
		name string
		h    ReqHeader
		p    []byte
		want Status
	}{
		{"read past the window", ReqHeader{Op: OpRead, Volume: v.ID, Offset: pageid.Size, Count: 8, Window: 1}, nil, StatusNoWindow},
		{"read straddling its end", ReqHeader{Op: OpRead, Volume: v.ID, Offset: pageid.Size - 4, Count: 8, Window: 1}, nil, StatusNoWindow},
		{"read of another volume", ReqHeader{Op: OpRead, Volume: w.ID, Count: 8, Window: 1}, nil, StatusNoWindow},
		{"write through a read window", ReqHeader{Op: OpWrite, Volume: v.ID, Window: 1}, []byte{1}, StatusNoWindow},
		{"trim through a read window", ReqHeader{Op: OpTrim, Volume: v.ID, Count: pageid.Size, Window: 1}, nil, StatusNoWindow},
		{"CAS through a read window", ReqHeader{Op: OpCAS, Volume: v.ID, Window: 1}, word[:], StatusNoWindow},
		{"FAA through a read window", ReqHeader{Op: OpFAA, Volume: v.ID, Window: 1}, word[:8], StatusNoWindow},
		{"prefetch inside", ReqHeader{Op: OpPrefetch, Offset: uint64(pageid.MakeKey(v.ID, 0)), Count: pageid.Size, Window: 1}, nil, StatusOK},
		{"prefetch outside", ReqHeader{Op: OpPrefetch, Offset: uint64(pageid.MakeKey(v.ID, 1)), Count: pageid.Size, Window: 1}, nil, StatusNoWindow},
		{"an unknown key", ReqHeader{Op: OpRead, Volume: v.ID, Count: 8, Window: 2}, nil, StatusNoWindow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, _ := r.do(tt.h, tt.p)
			assert.Equal(t, tt.want, st)
		})
	}

	assert.Equal(t, StatusBadRequest, r.bind(v.ID, 1, 0, 0, AccessAll), "key already bound")
	assert.Equal(t, StatusBadRequest, r.bind(v.ID, 0, 0, 0, AccessAll), "key 0")
	assert.Equal(t, StatusBadRequest, r.bind(v.ID, 3, 0, 0, 0), "no access")
	assert.Equal(t, StatusBadRequest, r.bind(v.ID, 3, 0, 0, 8), "unknown access")

	st, _ = r.do(ReqHeader{Op: OpUnbind, Window: 1}, nil)
	require.Equal(t, StatusOK, st)
	assert.Equal(t, StatusNoWindow, read(v.ID, 1, 0, 8), "unbound")
	st, _ = r.do(ReqHeader{Op: OpUnbind, Window: 1}, nil)
	assert.Equal(t, StatusNoWindow, st, "unbinding twice")

	// Every refusal above was per request: the connection still serves.
	require.Equal(t, StatusOK, r.bind(v.ID, 9, 0, 0, AccessAll))
	st, _ = r.do(ReqHeader{Op: OpWrite, Volume: v.ID, Offset: pageid.Size, Window: 9}, []byte{7})
	assert.Equal(t, StatusOK, st)
	got = make([]byte, 1)
	require.NoError(t, c.ReadAt(ctx, v.ID, pageid.Size, got))
	assert.Equal(t, []byte{7}, got)
}

// TestGrantLimitsVolumes: a grant's token reaches its volumes and nothing
// else, by name (create, open, list, delete) and by id (windows).
func TestGrantLimitsVolumes(t *testing.T) {
	srv := &Server{Store: NewStore(0), Token: "admin", Grants: []Grant{{Token: "t1", Volumes: []string{"t1.*"}}}}
	addr := serveT(t, srv)
	ctx := context.Background()

	admin := dialT(t, addr, "admin")
	mine, err := admin.Create(ctx, "t1.a", ChunkSize)
	require.NoError(t, err)
	theirs, err := admin.Create(ctx, "t2.a", ChunkSize)
	require.NoError(t, err)
	require.NoError(t, admin.WriteAt(ctx, theirs.ID, 0, []byte("secret")))

	_, err = Dial(ctx, addr, ClientOptions{Token: "t2"})
	assert.ErrorIs(t, err, ErrUnauthorised, "a token no one granted")

	t1 := dialT(t, addr, "t1")
	buf := make([]byte, 6)
	assert.ErrorIs(t, t1.ReadAt(ctx, theirs.ID, 0, buf), ErrUnauthorised)
	assert.ErrorIs(t, t1.WriteAt(ctx, theirs.ID, 0, []byte("mine!!")), ErrUnauthorised)
	_, err = t1.CompareAndSwap(ctx, theirs.ID, 0, 0, 1)
	assert.ErrorIs(t, err, ErrUnauthorised)
	assert.ErrorIs(t, t1.Prefetch(ctx, pageid.MakeKey(theirs.ID, 0), make([]byte, pageid.Size)), ErrUnauthorised)
	_, err = t1.Open(ctx, "t2.a")
	assert.ErrorIs(t, err, ErrUnauthorised)
	_, err = t1.Create(ctx, "t2.b", ChunkSize)
	assert.ErrorIs(t, err, ErrUnauthorised)
	assert.ErrorIs(t, t1.Delete(ctx, "t2.a"), ErrUnauthorised)
	list, err := t1.List(ctx)
	require.NoError(t, err)
	assert.Equal(t, []pageid.VolumeInfo{mine}, list)

	require.NoError(t, t1.WriteAt(ctx, mine.ID, 0, []byte("hello!")))
	require.NoError(t, t1.ReadAt(ctx, mine.ID, 0, buf))
	assert.Equal(t, "hello!", string(buf))
	require.NoError(t, admin.ReadAt(ctx, theirs.ID, 0, buf))
	assert.Equal(t, "secret", string(buf), "the refused write changed nothing")

	// A window names a volume id; each access checks the volume that has
	// the id now. Bound before the volume exists, it works once a granted
	// volume takes the id, and fails once that volume is gone.
	next := theirs.ID + 1
	assert.ErrorIs(t, t1.ReadAt(ctx, next, 0, buf), pageid.ErrNoVolume)
	later, err := admin.Create(ctx, "t1.later", ChunkSize)
	require.NoError(t, err)
	require.Equal(t, next, later.ID)
	require.NoError(t, t1.ReadAt(ctx, next, 0, buf))
	require.NoError(t, admin.Delete(ctx, "t1.later"))
	assert.ErrorIs(t, t1.ReadAt(ctx, next, 0, buf), pageid.ErrNoVolume)

	// Ids are reused once they wrap: a volume outside the grant that
	// inherits the id is out of reach through the old window.
	for i := 0; i < 1<<16; i++ {
		info, err := srv.Store.Create("t2.reused", ChunkSize)
		require.NoError(t, err)
		if info.ID == next {
			break
		}
		require.NoError(t, srv.Store.Delete("t2.reused"))
	}
	require.NoError(t, admin.WriteAt(ctx, next, 0, []byte("theirs")))
	assert.ErrorIs(t, t1.ReadAt(ctx, next, 0, buf), ErrUnauthorised)
}

// TestFirstTouchFromManyGoroutines: requests racing to be the first on a
// volume all find a window bound before them on the wire.
func TestFirstTouchFromManyGoroutines(t *testing.T) {
	_, addr := startNode(t, "", 0)
	ctx := context.Background()
	admin := dialT(t, addr, "")
	var vols []uint16
	for i := range 32 {
		v, err := admin.Create(ctx, fmt.Sprintf("v%d", i), ChunkSize)
		require.NoError(t, err)
		vols = append(vols, v.ID)
	}
	for round := range 4 {
		c := dialT(t, addr, "")
		errs := make(chan error, 8*len(vols))
		for g := range 8 {
			go func() {
				buf := make([]byte, 8)
				for i := range vols {
					v := vols[(i+g*round)%len(vols)]
					if g%2 == 0 {
						errs <- c.ReadAt(ctx, v, 0, buf)
					} else {
						errs <- c.Prefetch(ctx, pageid.MakeKey(v, 1), make([]byte, pageid.Size))
					}
				}
			}()
		}
		for range 8 * len(vols) {
			require.NoError(t, <-errs)
		}
	}
}
