package split

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/dpu"
	"github.com/pd3-go/pd3/dpu/parse"
	"github.com/pd3-go/pd3/hostview"
	"github.com/pd3-go/pd3/loadingzone"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/memnode/memnodetest"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
	"github.com/pd3-go/pd3/pagestore/pageproto"
)

// blockingRemote is a direct path whose write-backs wait for release.
type blockingRemote struct {
	pagestore.Remote
	entered, release chan struct{}
}

func (b *blockingRemote) WritePages(ctx context.Context, keys []pageid.Key, pages [][]byte) error {
	b.entered <- struct{}{}
	<-b.release
	return b.Remote.WritePages(ctx, keys, pages)
}

// splitRig is a memory node, a host Link and (once started) an agent
// process's loop, all in this process.
type splitRig struct {
	ctx    context.Context
	cancel context.CancelFunc
	c      *memnode.Client
	vol    pageid.VolumeInfo
	name   string
}

func newSplitRig(t *testing.T) *splitRig {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c, vol := memnodetest.Node(t, ctx, 1<<20)
	// Subtest names hold '/', which a region name (a file in /dev/shm) cannot.
	name := strings.NewReplacer("/", "-", ",", "", " ", "_").Replace(t.Name())
	return &splitRig{ctx: ctx, cancel: cancel, c: c, vol: vol, name: fmt.Sprintf("test-%s-%d", name, time.Now().UnixNano())}
}

// testAgent is an agent process's parts, wired here as host.RunAgent
// wires them (this package cannot import host, which imports it).
type testAgent struct {
	Agent  *dpu.Agent
	Engine *dpu.Engine
	Zone   *loadingzone.Zone
	HV     *hostview.Set
	Kernel *hostview.Set
}

// startAgent runs an agent on the rig's region until the test ends.
func (r *splitRig) startAgent(t *testing.T, c *memnode.Client) *testAgent {
	t.Helper()
	region, err := CreateAgentRegion(r.name, 1<<20, 256)
	require.NoError(t, err)
	ta := &testAgent{Zone: region.Zone, HV: hostview.New(8192, 2), Kernel: hostview.New(8192, 2)}
	region.Zone.OnDrop = func(k uint64) { ta.HV.Delete(k) }
	ta.Engine = dpu.NewEngine(dpu.NodeConn{Client: c}, ta.HV, region.Zone, 0)
	ta.Agent = dpu.NewAgent(ta.HV, region.Zone, ta.Engine, func() parse.Parser { return new(parse.PageParser) })
	ta.Agent.SetKernelView(ta.Kernel)
	ready, done := make(chan struct{}), make(chan struct{})
	var serveErr error
	go func() {
		defer close(done)
		serveErr = region.Serve(r.ctx, HostService{Agent: ta.Agent, Engine: ta.Engine, Kernel: ta.Kernel,
			NBDParser: func() parse.Parser { return &parse.NBDParser{Resolve: NBDResolver(r.ctx, c)} }, Ready: func() { close(ready) }})
	}()
	// The agent removes its region when it stops; wait for that.
	t.Cleanup(func() {
		r.cancel()
		<-done
		ta.Agent.Close()
		ta.Engine.Close()
		region.Close()
	})
	select {
	case <-ready:
		return ta
	case <-done:
		t.Fatalf("agent ended before it was ready: %v", serveErr)
		return nil
	}
}

// TestAttachWaitsForDirectWrites: an agent that appears while the host is
// writing back on its own connection is attached only once that write is
// acknowledged, so none of the agent's prefetches can overtake it.
func TestAttachWaitsForDirectWrites(t *testing.T) {
	r := newSplitRig(t)
	ctx := r.ctx
	agentConn, err := memnode.Dial(ctx, r.c.Addr(), memnode.ClientOptions{})
	require.NoError(t, err)
	defer agentConn.Close()
	direct := &blockingRemote{Remote: memnode.Remote{C: r.c}, entered: make(chan struct{}, 1), release: make(chan struct{})}
	l := OpenLink(r.name, direct)
	defer l.Close()

	k := pageid.MakeKey(r.vol.ID, 5)
	page := make([]byte, pageid.Size)
	binary.LittleEndian.PutUint64(page, 42)
	wrote := make(chan error, 1)
	go func() { wrote <- l.WritePages(ctx, []pageid.Key{k}, [][]byte{page}) }()
	<-direct.entered // the direct write is in flight

	r.startAgent(t, agentConn)
	// Nothing tells that the link tried to attach and waited: an absence
	// is asserted, over a window of several attach attempts.
	time.Sleep(400 * time.Millisecond)
	assert.False(t, l.Attached(), "attached while a direct write-back was in flight")
	close(direct.release)
	require.NoError(t, <-wrote)
	require.Eventually(t, l.Attached, 5*time.Second, 10*time.Millisecond, "attaches once the write is done")
}

// TestAttachResyncsHostView: an agent that attaches (a restart, say)
// learns the pages the host cache holds, so it does not prefetch them.
func TestAttachResyncsHostView(t *testing.T) {
	r := newSplitRig(t)
	vol := r.vol
	l := OpenLink(r.name, memnode.Remote{C: r.c})
	defer l.Close()
	held := []pageid.Key{pageid.MakeKey(vol.ID, 3), pageid.MakeKey(vol.ID, 9), pageid.MakeKey(vol.ID, 200)}
	// Enough keys for several 512-key messages; repeats are harmless.
	var extra []pageid.Key
	for p := uint64(0); p < 1000; p++ {
		extra = append(extra, pageid.MakeKey(vol.ID, 10+p%100))
	}
	l.SetResident(func(yield func(pageid.Key)) {
		for _, k := range append(held, extra...) {
			yield(k)
		}
	})
	a := r.startAgent(t, r.c)
	require.Eventually(t, l.Attached, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		for _, k := range held {
			if !a.HV.Contains(uint64(k)) {
				return false
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond, "the agent's Host View lacks pages the host holds")
	// The counter moves after each message is sent, so possibly after the
	// agent already applied it.
	require.Eventually(t, func() bool { return l.Resynced.Load() == uint64(len(held)+len(extra)) }, 5*time.Second, time.Millisecond)
	assert.False(t, a.HV.Contains(uint64(pageid.MakeKey(vol.ID, 150))), "a page the host does not hold")
}

// TestEvictionNoticeReachesAgent: eviction notices do not ring the
// agent's doorbell, yet they reach it ahead of the next request, so a GET
// of an evicted page is prefetched again while a GET of a page the host
// still holds is not.
func TestEvictionNoticeReachesAgent(t *testing.T) {
	r := newSplitRig(t)
	l := OpenLink(r.name, memnode.Remote{C: r.c})
	defer l.Close()
	held := []pageid.Key{pageid.MakeKey(r.vol.ID, 4), pageid.MakeKey(r.vol.ID, 7)}
	for _, k := range held {
		require.NoError(t, r.c.WriteAt(r.ctx, k.Volume(), k.Page()*pageid.Size, versioned(uint64(k))))
	}
	l.SetResident(func(yield func(pageid.Key)) {
		for _, k := range held {
			yield(k)
		}
	})
	a := r.startAgent(t, r.c)
	require.Eventually(t, func() bool { return a.HV.Contains(uint64(held[0])) && a.HV.Contains(uint64(held[1])) },
		5*time.Second, 10*time.Millisecond)
	// The case under test is an agent asleep on its doorbell when the
	// notice comes.
	require.Eventually(t, func() bool { a := l.cur.Load(); return a != nil && a.a.Sleeping() }, 5*time.Second, time.Millisecond,
		"the agent sleeps on its doorbell")
	l.Evicted(held[0])
	skipped := a.Agent.Skipped.Load()
	s := l.NewStream()
	for _, k := range held {
		var h [pageproto.HeaderSize]byte
		(&pageproto.Header{Op: pageproto.OpGet, ID: k}).EncodeRequest(h[:])
		s.Observe(h[:])
	}
	dst := make([]byte, pageid.Size)
	require.Eventually(t, func() bool { return l.CheckAndReturn(held[0], dst) == pageid.Size }, 5*time.Second, time.Millisecond,
		"the evicted page was not prefetched: the notice did not reach the agent before the GET")
	assert.Equal(t, uint64(held[0]), binary.LittleEndian.Uint64(dst))
	require.Eventually(t, func() bool { return a.Agent.Skipped.Load() > skipped }, 5*time.Second, time.Millisecond,
		"the agent decided about the page the host holds")
	assert.Zero(t, l.CheckAndReturn(held[1], dst), "a page the host holds was prefetched")
}

// TestSplitAgentGetsFUSEEvents: the kernel page-cache ranges and the read
// ranges a host sees reach an agent process: its kernel Host View follows
// them and sequential reads are prefetched past.
func TestSplitAgentGetsFUSEEvents(t *testing.T) {
	r := newSplitRig(t)
	vol := r.vol
	l := OpenLink(r.name, memnode.Remote{C: r.c})
	defer l.Close()
	a := r.startAgent(t, r.c)
	require.Eventually(t, l.Attached, 5*time.Second, 10*time.Millisecond)

	k := func(p uint64) pageid.Key { return pageid.MakeKey(vol.ID, p) }
	l.KernelRange(true, k(10), 4)
	l.KernelRange(false, k(10), 2)
	require.Eventually(t, func() bool {
		return !a.Kernel.Contains(uint64(k(10))) && !a.Kernel.Contains(uint64(k(11))) &&
			a.Kernel.Contains(uint64(k(12))) && a.Kernel.Contains(uint64(k(13)))
	}, 5*time.Second, 10*time.Millisecond, "kernel Host View does not follow the ranges")

	l.ReadAhead(dpu.SourceFUSE, k(100), 8, 0)
	l.ReadAhead(dpu.SourceFUSE, k(108), 8, 0) // sequential: predicts from 116 on
	require.Eventually(t, func() bool { return a.Engine.Placed.Load() >= 8 }, 5*time.Second, 10*time.Millisecond)
	dst := make([]byte, pageid.Size)
	assert.Equal(t, pageid.Size, a.Zone.CheckAndReturn(uint64(k(116)), dst), "the page after the stream was prefetched")

	// Pages a FUSE WRITE put in the host cache join Host View, so a
	// stream running into them prefetches none of them.
	// (Written is queued lazily: the next read wakes the agent, which
	// handles the writes first.)
	skipped := a.Agent.Skipped.Load()
	l.Written(k(200), 64)
	l.ReadAhead(dpu.SourceFUSE, k(184), 8, 0)
	l.ReadAhead(dpu.SourceFUSE, k(192), 8, 0) // predicts from 200 on
	require.Eventually(t, func() bool { return a.HV.Contains(uint64(k(200))) && a.HV.Contains(uint64(k(263))) },
		5*time.Second, 10*time.Millisecond, "written pages did not reach Host View")
	require.Eventually(t, func() bool { return a.Agent.Skipped.Load() >= skipped+8 }, 5*time.Second, 10*time.Millisecond,
		"the agent decided about the predicted pages the host holds")
	for p := uint64(200); p < 208; p++ {
		assert.Zero(t, a.Zone.CheckAndReturn(uint64(k(p)), dst), "page %d, which the host holds, was prefetched", p)
	}
}

// agentLink dials the agent's own memory-node connection and opens the
// host's Link, over the rig's node's connection, on the rig's region; both
// close when the test ends.
func (r *splitRig) agentLink(t *testing.T) (*Link, *memnode.Client) {
	t.Helper()
	agentConn, err := memnode.Dial(r.ctx, r.c.Addr(), memnode.ClientOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { agentConn.Close() })
	l := OpenLink(r.name, memnode.Remote{C: r.c})
	t.Cleanup(l.Close)
	return l, agentConn
}

// A fenced volume's write-backs go through the agent: the Link presents
// the host's fencing token on the agent's connection, at Fence and again
// when an agent attaches later, so the node takes the agent's writes
// instead of refusing them (and the host redoing each one directly).
func TestSplitAgentPresentsFencingToken(t *testing.T) {
	for _, attachFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("agent attached before Fence %v", attachFirst), func(t *testing.T) {
			r := newSplitRig(t)
			ctx := r.ctx
			l, agentConn := r.agentLink(t)
			fence := func() {
				require.NoError(t, r.c.Fence(ctx, r.vol.ID, 5))
				require.NoError(t, l.Fence(ctx, r.vol.ID, 5))
			}
			if attachFirst {
				r.startAgent(t, agentConn)
				require.Eventually(t, l.Attached, 5*time.Second, 5*time.Millisecond)
				fence()
			} else {
				fence()
				r.startAgent(t, agentConn)
				require.Eventually(t, l.Attached, 5*time.Second, 5*time.Millisecond)
			}
			page := make([]byte, pageid.Size)
			copy(page, "through the agent")
			require.NoError(t, l.WritePages(ctx, []pageid.Key{pageid.MakeKey(r.vol.ID, 3)}, [][]byte{page}))
			assert.Equal(t, uint64(1), l.AgentWrites.Load())
			assert.Zero(t, l.Fallbacks.Load(), "the node refused the agent's write")
			got := make([]byte, pageid.Size)
			require.NoError(t, r.c.ReadAt(ctx, r.vol.ID, 3*pageid.Size, got))
			assert.Equal(t, page, got)
		})
	}
}

// An agent whose memory-node connection has its write-backs refused (here:
// it never presented the volume's fencing token) costs a direct redo of
// each, never a loop: the redo used to hand the writes back to the same
// agent, recursing until the stack ran out.
func TestAgentRefusingWritesIsBypassed(t *testing.T) {
	r := newSplitRig(t)
	ctx := r.ctx
	l, agentConn := r.agentLink(t)
	r.startAgent(t, agentConn)
	require.Eventually(t, l.Attached, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, r.c.Fence(ctx, r.vol.ID, 5)) // the host's connection only

	page := make([]byte, pageid.Size)
	copy(page, "redone directly")
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, l.WritePages(wctx, []pageid.Key{pageid.MakeKey(r.vol.ID, 3)}, [][]byte{page}))
	assert.Equal(t, uint64(1), l.Fallbacks.Load())
	got := make([]byte, pageid.Size)
	require.NoError(t, r.c.ReadAt(ctx, r.vol.ID, 3*pageid.Size, got))
	assert.Equal(t, page, got)
	assert.True(t, l.Attached(), "the agent stays: it is only slower")
}

// A trim longer than one TRIM request, through an attached agent (a
// file of more than 4 GiB truncated on a host whose agent is a process
// of its own), frees the whole range without falling back.
func TestSplitAgentTrimsManyGiB(t *testing.T) {
	r := newSplitRig(t)
	ctx := r.ctx
	const bigVolume = 8 << 30 // past what one TRIM request may cover
	big, err := r.c.Create(ctx, "big", bigVolume)
	require.NoError(t, err)
	l, agentConn := r.agentLink(t)
	r.startAgent(t, agentConn)
	require.Eventually(t, l.Attached, 5*time.Second, 5*time.Millisecond)
	last := pageid.MakeKey(big.ID, 5<<30/pageid.Size-1)
	require.NoError(t, l.WritePages(ctx, []pageid.Key{last}, [][]byte{versioned(7)}))

	require.NoError(t, l.Trim(ctx, big.ID, 0, 5<<30))
	assert.Zero(t, l.Fallbacks.Load(), "the trim went around the agent")
	got := make([]byte, pageid.Size)
	require.NoError(t, r.c.ReadAt(ctx, big.ID, last.Page()*pageid.Size, got))
	assert.Equal(t, make([]byte, pageid.Size), got, "the last page trimmed still holds data")
}

// versioned is a page whose first 8 bytes are v.
func versioned(v uint64) []byte {
	p := make([]byte, pageid.Size)
	binary.LittleEndian.PutUint64(p, v)
	return p
}
