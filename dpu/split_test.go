package dpu

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pagestore"
)

// blockingRemote is a direct path whose write-backs wait for release.
type blockingRemote struct {
	pagestore.Remote
	entered, release chan struct{}
}

func (b *blockingRemote) WritePages(ctx context.Context, keys []memnode.Key, pages [][]byte) error {
	b.entered <- struct{}{}
	<-b.release
	return b.Remote.WritePages(ctx, keys, pages)
}

// TestAttachWaitsForDirectWrites: an agent that appears while the host is
// writing back on its own connection is attached only once that write is
// acknowledged, so none of the agent's prefetches can overtake it.
func TestAttachWaitsForDirectWrites(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &memnode.Server{Store: memnode.NewStore(0)}
	go srv.Serve(ctx, ln)
	defer srv.Close()
	dial := func() *memnode.Client {
		c, err := memnode.Dial(ctx, ln.Addr().String(), memnode.ClientOptions{})
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	host, agentConn := dial(), dial()
	vol, err := host.Create(ctx, "v", 1<<20)
	require.NoError(t, err)

	name := fmt.Sprintf("test-attach-%d", time.Now().UnixNano())
	direct := &blockingRemote{Remote: pagestore.MemnodeRemote{C: host}, entered: make(chan struct{}, 1), release: make(chan struct{})}
	l := OpenLink(name, direct)
	defer l.Close()

	k := memnode.MakeKey(vol.ID, 5)
	page := make([]byte, memnode.PageSize)
	binary.LittleEndian.PutUint64(page, 42)
	wrote := make(chan error, 1)
	go func() { wrote <- l.WritePages(ctx, []memnode.Key{k}, [][]byte{page}) }()
	<-direct.entered // the direct write is in flight

	agentDone := make(chan error, 1)
	go func() {
		agentDone <- RunSplitAgent(ctx, SplitAgentConfig{Name: name, Client: agentConn, LZRecords: 64, HostPages: 64, RingBytes: 1 << 20}, nil)
	}()
	time.Sleep(400 * time.Millisecond) // several attach attempts
	assert.False(t, l.Attached(), "attached while a direct write-back was in flight")
	close(direct.release)
	require.NoError(t, <-wrote)
	require.Eventually(t, l.Attached, 5*time.Second, 10*time.Millisecond, "attaches once the write is done")
	cancel()
	<-agentDone
}

// TestInvalidateDropsOldCopies: after a write by another connection and
// Invalidate, neither a placed copy nor a prefetch in flight serves the
// old bytes.
func TestInvalidateDropsOldCopies(t *testing.T) {
	r := newRig(t, 256)
	ctx := context.Background()
	dst := make([]byte, memnode.PageSize)
	for i := uint64(0); i < 100; i++ {
		k := memnode.MakeKey(r.vol.ID, 1+i%100)
		require.NoError(t, r.e.c.WriteAt(ctx, k.Volume(), k.Page()*memnode.PageSize, versioned(2*i)))
		r.e.Prefetch(k)
		if i%2 == 0 {
			require.Eventually(t, func() bool { return !r.e.inFlight(k) }, 5*time.Second, time.Millisecond)
		}
		// The host writes around the engine, then tells it.
		require.NoError(t, r.e.c.WriteAt(ctx, k.Volume(), k.Page()*memnode.PageSize, versioned(2*i+1)))
		r.e.Invalidate(k)
		assert.False(t, r.hv.Contains(uint64(k)))
		time.Sleep(200 * time.Microsecond)
		if r.lz.CheckAndReturn(uint64(k), dst) == memnode.PageSize {
			require.Equal(t, 2*i+1, binary.LittleEndian.Uint64(dst), "round %d: old copy served", i)
		}
	}
}
