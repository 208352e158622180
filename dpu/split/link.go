package split

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/dpu/mirror"
	"github.com/pd3-go/pd3/internal/pipeline"
	"github.com/pd3-go/pd3/internal/shm"
	"github.com/pd3-go/pd3/internal/shmring"
	"github.com/pd3-go/pd3/loadingzone"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
)

// The host's side of split mode: attaching to an agent's region, failing
// over when it dies, and the host's calls, hints and mirrored bytes (message
// format: ringmsg.go).

// ErrAgentGone is returned inside the Link when the agent stopped; callers
// never see it, the Link redoes the work on the direct path.
var ErrAgentGone = errors.New("dpu: agent gone")

// Link is the host's side of split mode. It implements pagestore.Remote
// (the host's reads and write-backs go to the agent's transfer engine),
// pagestore.Prefetched (the agent's Loading Zone), mirror.Mirror (request
// bytes go to the agent) and Evicted (eviction notices). Whenever no live
// agent is attached it serves everything through Direct.
type Link struct {
	name   string
	direct pagestore.Remote

	cur       atomic.Pointer[attachment]
	deadEpoch atomic.Uint64 // the last agent declared dead
	// directMu is held shared by every write-back or trim that goes the
	// direct path, and exclusively while an agent is attached: a newly
	// attached agent's prefetches travel on its own memnode connection, so
	// a direct WRITE still in flight could land after such a prefetch read
	// the old page (JUNE BERRY's rule: one queue per page). Attaching waits
	// for those writes; writes that start after it go through the agent.
	directMu sync.RWMutex

	mu    sync.Mutex // serialises ring A producers
	pool  sync.Pool  // *linkCall
	conns atomic.Uint32

	stop chan struct{}
	done chan struct{}

	resident atomic.Pointer[func(yield func(pageid.Key))] // SetResident

	fmu    sync.Mutex
	fences map[uint16]uint64 // Fence: presented to every agent that attaches

	// Counters. Resynced counts pages reported to attaching agents.
	Attaches, Deaths, Fallbacks, MirrorDrops, AgentReads, AgentWrites atomic.Uint64
	Resynced                                                          atomic.Uint64
}

type attachment struct {
	region *shm.Region
	a, b   *shmring.Ring
	lz     *loadingzone.Zone
	epoch  uint64
	beat   *atomic.Uint64
	dead   atomic.Bool
	refs   atomic.Int64
	done   chan struct{} // reply reader exited
	// calls waits for this agent's replies; killing the agent fails it,
	// and with it every call in flight.
	calls *pipeline.Table[linkCall]
}

// linkSlots bounds the host's calls in flight to one agent; a caller
// beyond it waits for a reply (write-backs send 64 at a time per caller).
const linkSlots = 4096

// linkCall is one host request waiting for the agent's reply. Calls are
// pooled; done (buffered, one token) is signalled exactly once, by the
// reply reader or by kill, whichever removes the call from its
// attachment's table.
type linkCall struct {
	a    *attachment
	tag  uint32
	dst  []byte
	err  error
	done chan struct{}
}

// OpenLink starts a link to the agent region name, serving through direct
// until an agent is attached.
func OpenLink(name string, direct pagestore.Remote) *Link {
	l := &Link{name: name, direct: direct, stop: make(chan struct{}), done: make(chan struct{})}
	l.pool.New = func() any { return &linkCall{done: make(chan struct{}, 1)} }
	l.tryAttach(0)
	go l.watch()
	return l
}

// Attached reports whether a live agent serves the host now.
func (l *Link) Attached() bool { a := l.cur.Load(); return a != nil && !a.dead.Load() }

// Epoch returns the attached agent's epoch, 0 if none.
func (l *Link) Epoch() uint64 {
	if a := l.cur.Load(); a != nil && !a.dead.Load() {
		return a.epoch
	}
	return 0
}

// Close detaches; the agent keeps running.
func (l *Link) Close() {
	close(l.stop)
	<-l.done
	if a := l.cur.Swap(nil); a != nil {
		l.retire(a)
	}
}

func (l *Link) tryAttach(deadEpoch uint64) {
	region, err := shm.Open(l.name)
	if err != nil {
		return
	}
	b := region.Bytes()
	if len(b) < splitHeader || shm.U64(b, offSMagic).Load() != splitMagic {
		region.Close()
		return
	}
	epoch := shm.U64(b, offSEpoch).Load()
	if epoch == deadEpoch {
		region.Close()
		return
	}
	lay := layout(int(shm.U64(b, offSRingSize).Load()), int(shm.U64(b, offSRecords).Load()))
	if lay.total > len(b) {
		region.Close()
		return
	}
	beat := shm.U64(b, offSBeat)
	b0 := beat.Load()
	time.Sleep(3 * heartbeatEvery)
	if beat.Load() == b0 {
		region.Close() // a region left by a dead agent
		return
	}
	ra, err1 := shmring.Attach(b[lay.ringA:], lay.ringSize)
	rb, err2 := shmring.Attach(b[lay.ringB:], lay.ringSize)
	z, err3 := loadingzone.Attach(b[lay.lz:])
	if err1 != nil || err2 != nil || err3 != nil || z.Epoch() != epoch {
		region.Close()
		return
	}
	a := &attachment{region: region, a: ra, b: rb, lz: z, epoch: epoch, beat: beat, done: make(chan struct{}),
		calls: pipeline.NewTable[linkCall](linkSlots)}
	go l.readReplies(a)
	// The agent's connection presents the volumes' fencing tokens before
	// it carries a write-back: the node would refuse its writes otherwise
	// (they would be redone directly, correct but twice).
	l.fmu.Lock()
	fences := maps.Clone(l.fences)
	l.fmu.Unlock()
	for vol, token := range fences {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		l.fenceOn(ctx, a, vol, token)
		cancel()
	}
	l.directMu.Lock()
	l.cur.Store(a)
	l.directMu.Unlock()
	l.Attaches.Add(1)
	if each := l.resident.Load(); each != nil {
		go l.resync(a, *each)
	}
}

// watch checks the agent's heartbeat, declares it dead when it stops, and
// looks for a new agent.
func (l *Link) watch() {
	defer close(l.done)
	const period, deadAfter = 20 * time.Millisecond, 250 * time.Millisecond
	t := time.NewTicker(period)
	defer t.Stop()
	var lastBeat uint64
	lastMove := time.Now()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		a := l.cur.Load()
		if a == nil {
			l.tryAttach(l.deadEpoch.Load())
			lastMove = time.Now()
			continue
		}
		if b := a.beat.Load(); b != lastBeat {
			lastBeat, lastMove = b, time.Now()
			continue
		}
		if time.Since(lastMove) > deadAfter {
			l.kill(a)
		}
	}
}

// kill declares a dead: it stops being consulted and every call waiting on
// it fails over to the direct path.
func (l *Link) kill(a *attachment) {
	if a.dead.Swap(true) {
		return // already killed
	}
	// Never re-attach to this epoch: its Loading Zone may hold what the
	// host could not invalidate.
	l.deadEpoch.Store(a.epoch)
	l.cur.CompareAndSwap(a, nil)
	l.Deaths.Add(1)
	calls, _ := a.calls.Fail(ErrAgentGone)
	for _, c := range calls {
		c.err = ErrAgentGone
		c.done <- struct{}{}
	}
	go l.retire(a)
}

// retire unmaps a once no CheckAndReturn uses it and its reader has exited.
func (l *Link) retire(a *attachment) {
	a.dead.Store(true)
	<-a.done
	for a.refs.Load() != 0 {
		time.Sleep(time.Millisecond)
	}
	a.region.Close()
}

func (l *Link) readReplies(a *attachment) {
	defer close(a.done)
	for !a.dead.Load() {
		m := a.b.Next()
		if m == nil {
			a.b.Wait(20 * time.Millisecond)
			continue
		}
		if tag, st, page, err := decodeReply(m); err == nil || tag != 0 {
			if c := a.calls.Take(tag); c != nil {
				switch {
				case err != nil:
					c.err = fmt.Errorf("%w: %w", errAgentFailed, err)
				case st != memnode.StatusOK:
					c.err = replyErr(st)
				case c.dst != nil:
					copy(c.dst, page)
				}
				c.done <- struct{}{}
			}
		}
		a.b.Release()
	}
}

// send puts one message in ring A; it reports false if the agent is gone
// or the ring stays full (then the caller falls back or drops).
func (l *Link) send(a *attachment, wait bool, parts ...[]byte) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := 0; ; i++ {
		if a.dead.Load() {
			return false
		}
		if a.a.Send(parts...) {
			return true
		}
		if !wait || i > 1000 {
			return false
		}
		runtime.Gosched()
	}
}

func (l *Link) call(ctx context.Context, a *attachment, op msgType, k pageid.Key, dst, page []byte) error {
	c := l.start(a, op, k, dst, page)
	if c == nil {
		return ErrAgentGone
	}
	return l.wait(ctx, c)
}

// start registers a call and sends its request; nil if the agent is gone.
func (l *Link) start(a *attachment, op msgType, k pageid.Key, dst, page []byte) *linkCall {
	hdr := encodeKey(msgHeader{typ: op}, k)
	return l.startMsg(a, hdr[:], dst, page)
}

// startMsg sends hdr (its tag field is filled in here) and payload as a
// call whose reply's page will be copied into dst.
func (l *Link) startMsg(a *attachment, hdr, dst, page []byte) *linkCall {
	c := l.pool.Get().(*linkCall)
	c.a, c.dst, c.err = a, dst, nil
	tag, _, err := a.calls.Register(c)
	if err != nil { // the agent was declared dead
		c.a = nil
		l.pool.Put(c)
		return nil
	}
	c.tag = tag
	binary.LittleEndian.PutUint32(hdr[4:], tag) // msgHeader.tag
	if !l.send(a, true, hdr, page) {
		if a.calls.Take(tag) == nil {
			<-c.done // kill took it meanwhile
		}
		c.a = nil
		l.pool.Put(c)
		return nil
	}
	return c
}

// wait returns the call's result and recycles it.
func (l *Link) wait(ctx context.Context, c *linkCall) error {
	select {
	case <-c.done:
	case <-ctx.Done():
		// The reply may still come; it finds no call and is dropped. dst
		// is not written after we return: the reader copies only into
		// calls it removed from the table, and we remove ours now.
		if c.a.calls.Take(c.tag) == nil {
			<-c.done // the reader (or kill) took it: let it finish
		}
		c.a = nil
		l.pool.Put(c)
		return ctx.Err()
	}
	err := c.err
	c.a = nil
	l.pool.Put(c)
	return err
}

var (
	_ pagestore.Remote     = (*Link)(nil)
	_ pagestore.Prefetched = (*Link)(nil)
	_ mirror.Mirror        = (*Link)(nil)
)

// ReadPage implements pagestore.Remote.
func (l *Link) ReadPage(ctx context.Context, k pageid.Key, dst []byte) error {
	if a := l.cur.Load(); a != nil && !a.dead.Load() {
		err := l.call(ctx, a, msgRead, k, dst, nil)
		if err == nil {
			l.AgentReads.Add(1)
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		l.Fallbacks.Add(1)
	}
	return l.direct.ReadPage(ctx, k, dst)
}

// WritePages implements pagestore.Remote. Writes are idempotent, so any
// that the agent did not acknowledge are redone directly.
func (l *Link) WritePages(ctx context.Context, keys []pageid.Key, pages [][]byte) error {
	a := l.cur.Load()
	if a == nil || a.dead.Load() {
		return l.writeDirect(ctx, keys, pages)
	}
	// Send every write, then collect the replies: one round trip per
	// batch, no goroutine per page.
	const batch = 64
	var calls [batch]*linkCall
	var redoK []pageid.Key
	var redoP [][]byte
	for start := 0; start < len(keys); start += batch {
		n := min(batch, len(keys)-start)
		for i := 0; i < n; i++ {
			calls[i] = l.start(a, msgWrite, keys[start+i], nil, pages[start+i])
		}
		for i := 0; i < n; i++ {
			err := ErrAgentGone
			if calls[i] != nil {
				err = l.wait(ctx, calls[i])
			}
			if err != nil {
				redoK, redoP = append(redoK, keys[start+i]), append(redoP, pages[start+i])
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	l.AgentWrites.Add(uint64(len(keys) - len(redoK)))
	if len(redoK) > 0 {
		l.Fallbacks.Add(uint64(len(redoK)))
		// Direct, even though the agent is attached: writeDirect would
		// hand the writes back to it, and an agent that refuses them (one
		// whose connection lacks the volume's fencing token) would loop.
		// The invalidation below keeps its Loading Zone from serving the
		// pages it did not write.
		l.directMu.RLock()
		err := l.direct.WritePages(ctx, redoK, redoP)
		l.directMu.RUnlock()
		if err != nil {
			return err
		}
		l.invalidate(ctx, a, redoK)
	}
	return nil
}

// Fence presents volume vol's fencing token on the agent's memory-node
// connection, and on that of every agent that attaches later; the host's
// own connection (the direct path) is the caller's to fence. An agent that
// cannot present it only costs speed: its refused write-backs are redone
// directly. It fails with pageid.ErrFenced when a newer token is there.
func (l *Link) Fence(ctx context.Context, vol uint16, token uint64) error {
	l.fmu.Lock()
	if l.fences == nil {
		l.fences = make(map[uint16]uint64)
	}
	l.fences[vol] = token
	l.fmu.Unlock()
	a := l.cur.Load()
	if a == nil || a.dead.Load() {
		return nil
	}
	if err := l.fenceOn(ctx, a, vol, token); errors.Is(err, pageid.ErrFenced) {
		return err
	}
	return nil
}

func (l *Link) fenceOn(ctx context.Context, a *attachment, vol uint16, token uint64) error {
	m := encodeFence(0, vol, token)
	c := l.startMsg(a, m[:], nil, nil)
	if c == nil {
		return ErrAgentGone
	}
	return l.wait(ctx, c)
}

// invalidate tells a live agent about pages written back around it, so a
// prefetch it issued before (or in flight during) the direct write cannot
// serve the old copy. If the agent cannot be told, it is declared dead:
// its Loading Zone is never consulted again.
func (l *Link) invalidate(ctx context.Context, a *attachment, keys []pageid.Key) {
	if a.dead.Load() {
		return
	}
	calls := make([]*linkCall, len(keys))
	ok := true
	for i, k := range keys {
		if calls[i] = l.start(a, msgInvalidate, k, nil, nil); calls[i] == nil {
			ok = false
		}
	}
	for _, c := range calls {
		if c != nil && l.wait(ctx, c) != nil {
			ok = false
		}
	}
	if !ok && !a.dead.Load() {
		l.kill(a)
	}
}

// writeDirect writes back on the host's own connection, holding off any
// agent attach until the writes are acknowledged. If an agent attached
// meanwhile, the writes go through it instead.
func (l *Link) writeDirect(ctx context.Context, keys []pageid.Key, pages [][]byte) error {
	l.directMu.RLock()
	if a := l.cur.Load(); a != nil && !a.dead.Load() {
		l.directMu.RUnlock()
		return l.WritePages(ctx, keys, pages)
	}
	defer l.directMu.RUnlock()
	return l.direct.WritePages(ctx, keys, pages)
}

// Trim implements pagestore.Trimmer through the agent (which invalidates
// its Loading Zone), or directly when no agent is attached.
func (l *Link) Trim(ctx context.Context, vol uint16, off, n uint64) error {
	direct, ok := l.direct.(pagestore.Trimmer)
	if a := l.cur.Load(); a != nil && !a.dead.Load() {
		m := encodeTrim(0, vol, off, n)
		err := ErrAgentGone
		if c := l.startMsg(a, m[:], nil, nil); c != nil {
			err = l.wait(ctx, c)
		}
		if err == nil || ctx.Err() != nil || !ok {
			return err
		}
		l.Fallbacks.Add(1)
	}
	if !ok {
		return fmt.Errorf("dpu: direct path cannot trim")
	}
	l.directMu.RLock() // as writeDirect: no attach while a trim is in flight
	defer l.directMu.RUnlock()
	return direct.Trim(ctx, vol, off, n)
}

// Map implements pagestore.Mapper by the direct path, which reaches the
// nodes as the agent does (every run is data when it cannot map). The
// agent's prefetches store nothing, so it need not be asked.
func (l *Link) Map(ctx context.Context, vol uint16, off, n uint64, fn func(off, n uint64, hole bool)) error {
	if m, ok := l.direct.(pagestore.Mapper); ok {
		return m.Map(ctx, vol, off, n, fn)
	}
	fn(off, n, false)
	return nil
}

var _ pagestore.Mapper = (*Link)(nil)

var _ pagestore.Trimmer = (*Link)(nil)

// CheckAndReturn implements pagestore.Prefetched: the agent's Loading Zone
// while it lives, nothing otherwise.
func (l *Link) CheckAndReturn(k pageid.Key, dst []byte) int {
	a := l.cur.Load()
	if a == nil {
		return 0
	}
	a.refs.Add(1)
	defer a.refs.Add(-1)
	if a.dead.Load() {
		return 0
	}
	return a.lz.CheckAndReturn(uint64(k), dst)
}

// SetResident gives the Link a way to list the pages the host cache holds;
// they are sent to every agent that attaches from then on.
func (l *Link) SetResident(each func(yield func(pageid.Key))) { l.resident.Store(&each) }

// resync tells a newly attached agent which pages the host cache holds,
// 512 keys per message. An eviction racing the walk can leave a key the
// host no longer holds: one skipped prefetch, never a wrong answer.
func (l *Link) resync(a *attachment, each func(yield func(pageid.Key))) {
	const perMsg = 512
	hdr := encodeHeader(msgHeader{typ: msgResident})
	buf := make([]byte, 0, perMsg*8)
	flush := func() bool {
		if len(buf) == 0 {
			return true
		}
		ok := l.send(a, true, hdr[:], buf)
		if ok {
			l.Resynced.Add(uint64(len(buf) / 8))
		}
		buf = buf[:0]
		return ok
	}
	alive := true
	each(func(k pageid.Key) {
		if !alive {
			return
		}
		buf = binary.LittleEndian.AppendUint64(buf, uint64(k))
		if len(buf) == cap(buf) {
			alive = flush()
		}
	})
	if alive {
		flush()
	}
}

// KernelRange tells the agent the kernel page cache added (or dropped) n
// pages from first: the host's tracker feeding the agent's kernel Host
// View. Dropped when no agent is attached or its ring is full (a hint).
func (l *Link) KernelRange(added bool, first pageid.Key, n int) {
	kind := byte(kernelDropped)
	if added {
		kind = kernelAdded
	}
	l.rangeMsg(msgKernel, kind, first, n, 0)
}

// ReadAhead tells the agent source src read n pages from first, in a file
// that ends before page end (0: unknown).
func (l *Link) ReadAhead(src int, first pageid.Key, n int, end uint64) {
	l.rangeMsg(msgReadAhead, byte(src), first, n, end)
}

// Written tells the agent a write no parser saw put n pages from first in
// the host cache (see Agent.Written).
func (l *Link) Written(first pageid.Key, n int) {
	l.rangeMsg(msgWritten, 0, first, n, 0)
}

func (l *Link) rangeMsg(op msgType, arg byte, first pageid.Key, n int, end uint64) {
	a := l.cur.Load()
	if a == nil {
		return
	}
	m := encodeRange(op, arg, first, uint32(min(n, maxRangePages)), end)
	if !l.send(a, false, m[:]) {
		l.MirrorDrops.Add(1)
	}
}

// Evicted forwards a host cache eviction to the agent (dropped if the agent
// is gone or behind: Host View then errs toward prefetching).
func (l *Link) Evicted(k pageid.Key) {
	a := l.cur.Load()
	if a == nil {
		return
	}
	m := encodeKey(msgHeader{typ: msgEvict}, k)
	// Nobody waits on a notice: it rides with the next message that wakes
	// the agent (or its 10 ms Wait timeout), which saves the host a futex
	// wake per eviction, 61% of its doorbell syscalls under random GETs.
	l.mu.Lock()
	if !a.dead.Load() {
		a.a.SendLazy(m[:])
	}
	l.mu.Unlock()
}

type linkStream struct {
	l      *Link
	conn   uint32
	proto  byte
	broken bool // bytes were dropped: the agent's view has a hole
}

// NewStream implements mirror.Mirror for the page protocol.
func (l *Link) NewStream() mirror.Stream {
	return &linkStream{l: l, conn: l.conns.Add(1), proto: ProtoPage}
}

// Mirror returns a mirror for a frontend speaking proto (ProtoNBD).
func (l *Link) Mirror(proto byte) mirror.Mirror { return linkMirror{l, proto} }

type linkMirror struct {
	l     *Link
	proto byte
}

func (m linkMirror) NewStream() mirror.Stream {
	return &linkStream{l: m.l, conn: m.l.conns.Add(1), proto: m.proto}
}

// Observe copies the bytes into ring A without waiting; if the agent is
// gone or behind they are dropped (its parser then loses that stream).
func (s *linkStream) Observe(b []byte) {
	a := s.l.cur.Load()
	if a == nil || s.broken {
		return
	}
	h := encodeHeader(msgHeader{typ: msgMirror, arg: s.proto, tag: s.conn})
	for len(b) > 0 {
		n := min(len(b), a.a.MaxMessage()-8)
		if !s.l.send(a, false, h[:], b[:n]) {
			// A parser fed a stream with a hole could misread it: stop
			// mirroring this connection and tell the agent to forget it.
			s.l.MirrorDrops.Add(1)
			s.broken = true
			s.Close()
			return
		}
		b = b[n:]
	}
}

func (s *linkStream) Close() {
	if a := s.l.cur.Load(); a != nil {
		h := encodeHeader(msgHeader{typ: msgClose, tag: s.conn})
		s.l.send(a, false, h[:])
	}
}
