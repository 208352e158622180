package dpu

import (
	"sync"
	"sync/atomic"

	"github.com/pd3-go/pd3/dpu/mirror"
	"github.com/pd3-go/pd3/dpu/parse"
	"github.com/pd3-go/pd3/hostview"
	"github.com/pd3-go/pd3/loadingzone"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
)

// Agent is the DPU agent: it parses mirrored requests, asks Host View which
// pages will miss, and has the Engine prefetch those into the Loading Zone.
// Host cache evictions arrive through Evicted.
type Agent struct {
	hv     *hostview.Set
	lz     *loadingzone.Zone
	engine *Engine
	parser func() parse.Parser

	mu      sync.Mutex // guards pending
	pending []parse.Access
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}

	// Resident, if set, tells whether the host cache holds a page (only
	// an agent inside the host process can ask); it is used to count
	// Host View false negatives, never to decide.
	Resident func(pageid.Key) bool

	// kernel, if set, is the Host View of the kernel page cache above
	// the host's (FUSE files): pages it holds are never read from the
	// host, so they are not prefetched either.
	kernel atomic.Pointer[hostview.Set]

	// seq predicts the FUSE path's streams (ReadAhead); streams predicts
	// the mirrored requests' (NBD, page protocol). All mirrored
	// connections are one source: a client with several connections to
	// one export (NBD multi-conn: nbdfuse, qemu) spreads each of its
	// streams over all of them, request by request (docs/decisions.md, 2).
	seq, streams Sequential
	scratch      sync.Pool // *[]Access for ReadAhead

	// VolumePages, if set, tells the number of pages of a volume, so
	// that no page past its end is predicted.
	VolumePages func(vol uint16) uint64

	// Counters.
	Parsed, Prefetches, Skipped, LostStreams, QueueDrops atomic.Uint64
	// KernelSkipped counts prefetches skipped because the kernel page
	// cache holds the page.
	KernelSkipped atomic.Uint64
	Evictions     atomic.Uint64
	// FalseNegatives counts prefetches of pages the host cache held.
	FalseNegatives atomic.Uint64
}

// maxPending bounds parsed accesses waiting for the prefetcher; past it
// new ones are dropped (the host is never slowed by a lagging agent).
const maxPending = 1 << 16

// NewAgent starts the prefetcher goroutine. parser makes the parser for
// each mirrored connection.
func NewAgent(hv *hostview.Set, lz *loadingzone.Zone, engine *Engine, parser func() parse.Parser) *Agent {
	a := &Agent{
		hv: hv, lz: lz, engine: engine, parser: parser,
		pending: make([]parse.Access, 0, 4096),
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	go a.loop()
	return a
}

// Close stops the prefetcher.
func (a *Agent) Close() {
	close(a.stop)
	<-a.done
}

type stream struct {
	a *Agent
	p parse.Parser
	// leave: the host reads the requests' own pages (HostReadsMirror).
	leave bool
	ahead Ahead
	buf   []parse.Access
	pred  []parse.Access // parsed and predicted accesses, reused
	keys  []pageid.Key   // predicted pages, reused
	dead  bool
}

var _ mirror.Mirror = (*Agent)(nil)

// NewStream implements mirror.Mirror with the agent's default parser.
func (a *Agent) NewStream() mirror.Stream { return a.newStream(a.parser, false, Ahead{}) }

func (a *Agent) newStream(f func() parse.Parser, leave bool, ahead Ahead) mirror.Stream {
	return &stream{a: a, p: f(), leave: leave, ahead: ahead, buf: make([]parse.Access, 0, 256), pred: make([]parse.Access, 0, 512), keys: make([]pageid.Key, 0, 256)}
}

// Mirror returns a mirror whose streams are parsed by parsers from f, for a
// frontend that speaks another protocol (NBD).
func (a *Agent) Mirror(f func() parse.Parser) mirror.Mirror { return agentMirror{a, f, false, Ahead{}} }

// HostReadsMirror is Mirror for a frontend whose host reads every
// request's own missing pages itself as soon as it has parsed the request
// (NBD in the host's process: a stream straight into the reply, a small
// read on the connection's reader, each page entered in Host View before
// it is read). The agent sees the request after the host's reader, so it
// would find those pages in Host View and skip them, after a wake-up of
// the prefetcher per request; it prefetches only what its stream
// predictor expects past the reads (docs/decisions.md, 8 and 31): the
// pages after stream reads through ahead, the rest into the Loading Zone.
func (a *Agent) HostReadsMirror(f func() parse.Parser, ahead Ahead) mirror.Mirror {
	return agentMirror{a, f, true, ahead}
}

// Ahead is where a host that reads its requests' own pages takes the
// pages predicted past its stream reads: Read (pagestore.Store.ReadAhead)
// reads them into windows of the host's, which its next stream reads
// copy from, instead of the Loading Zone (docs/decisions.md, 33). It
// takes the pages predicted past reads of at least From pages (the
// reads that look in those windows); From 0: none.
type Ahead struct {
	Read func(first pageid.Key, n int) bool
	From int
}

type agentMirror struct {
	a     *Agent
	f     func() parse.Parser
	leave bool
	ahead Ahead
}

func (m agentMirror) NewStream() mirror.Stream { return m.a.newStream(m.f, m.leave, m.ahead) }

func (s *stream) Observe(b []byte) {
	if s.dead {
		return
	}
	out, err := s.p.Feed(b, s.buf[:0])
	if err != nil {
		s.dead = true
		s.a.LostStreams.Add(1)
	}
	if parsed := len(out); parsed > 0 {
		if acc := s.predict(out); len(acc) > 0 {
			s.a.push(acc, prefetches(acc), parsed)
		} else {
			s.a.Parsed.Add(uint64(parsed)) // nothing to prefetch: counted all the same
		}
	}
	s.buf = out[:0]
}

// prefetches reports whether acc holds a read for the prefetcher. Writes
// and deletions alone only change Host View for the next prefetch
// decision, which comes with a read that wakes the prefetcher anyway (and
// is processed after them), so they wait for it, as eviction notices do,
// rather than cost a thread wake-up per write (docs/decisions.md, 40).
func prefetches(acc []parse.Access) bool {
	for _, a := range acc {
		if a.Kind == parse.Read {
			return true
		}
	}
	return false
}

// predict returns acc with, after each run of consecutive page reads in
// it (one request, or requests that continue each other), the pages the
// stream predictor expects next. A run whose pages were all predicted
// before is left out: they are in the Loading Zone or on their way, and
// the host may already have taken them (a large read takes them without
// caching them), so asking again would fetch them twice
// (docs/decisions.md, 3).
func (s *stream) predict(acc []parse.Access) []parse.Access {
	out := s.pred[:0]
	for i := 0; i < len(acc); {
		if acc[i].Kind != parse.Read {
			out = append(out, acc[i])
			i++
			continue
		}
		j := i + 1
		for j < len(acc) && acc[j].Kind == parse.Read && acc[j].Key == acc[j-1].Key+1 && acc[j].Key.Volume() == acc[i].Key.Volume() {
			j++
		}
		var end uint64
		if s.a.VolumePages != nil {
			if end = s.a.VolumePages(acc[i].Key.Volume()); end == 0 {
				out = append(out, acc[i:j]...) // not a served volume
				i = j
				continue
			}
		}
		var covered bool
		s.keys, covered = s.a.streams.AccessCovered(SourceMirrored, acc[i].Key, j-i, end, s.keys[:0])
		if !covered && !s.leave {
			out = append(out, acc[i:j]...)
		}
		if s.leave && s.ahead.From > 0 && j-i >= s.ahead.From {
			s.readAhead(s.keys, j-i)
		} else {
			for _, k := range s.keys {
				out = append(out, parse.Access{Key: k, Kind: parse.Read})
			}
		}
		i = j
	}
	s.pred = out
	return out
}

// readAhead hands keys (predicted past a stream read of n pages) to
// s.ahead in windows of n pages (at most a window's bound), runs of
// consecutive pages each, so that each later read of the stream finds its
// pages in one window.
func (s *stream) readAhead(keys []pageid.Key, n int) {
	n = min(n, pagestore.MaxWindowPages)
	for i := 0; i < len(keys); {
		j := i + 1
		for j < len(keys) && j-i < n && keys[j] == keys[j-1]+1 && keys[j].Volume() == keys[i].Volume() {
			j++
		}
		s.ahead.Read(keys[i], j-i)
		s.a.Prefetches.Add(uint64(j - i))
		i = j
	}
}

func (s *stream) Close() {}

// Predictors returns the counters of the mirrored requests' stream
// predictor and of the FUSE path's.
func (a *Agent) Predictors() (mirrored, fuse *SequentialStats) {
	return a.streams.Stats(), a.seq.Stats()
}

// Evicted tells the agent the host cache dropped page k (PD3 leaves this
// unreflected; pd3 removes the key from Host View so it is prefetched again).
func (a *Agent) Evicted(k pageid.Key) {
	a.Evictions.Add(1)
	a.enqueueLazy([]parse.Access{{Key: k, Kind: parse.Delete}})
}

// lazyBatch is how many queued eviction notices wake the prefetcher on
// their own. A notice only matters to the next prefetch decision, which
// arrives with an access that wakes the prefetcher anyway (and is
// processed after the notices queued before it); waking it for every
// eviction cost a goroutine wake-up per host miss.
const lazyBatch = 256

func (a *Agent) enqueue(acc []parse.Access) { a.push(acc, true, len(acc)) }

// Enqueue queues accesses the agent learns of other than by parsing a
// stream: split mode's resync of the pages a host holds (as writes, so
// Host View adds them).
func (a *Agent) Enqueue(acc []parse.Access) { a.enqueue(acc) }

func (a *Agent) enqueueLazy(acc []parse.Access) { a.push(acc, false, len(acc)) }

// push queues acc for the prefetcher, the first parsed of them parsed
// from a mirrored stream (the rest predicted).
func (a *Agent) push(acc []parse.Access, urgent bool, parsed int) {
	a.mu.Lock()
	if len(a.pending)+len(acc) > maxPending {
		a.mu.Unlock()
		a.QueueDrops.Add(uint64(len(acc)))
		return
	}
	a.pending = append(a.pending, acc...)
	urgent = urgent || len(a.pending) >= lazyBatch
	a.mu.Unlock()
	a.Parsed.Add(uint64(parsed))
	if !urgent {
		return
	}
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

func (a *Agent) loop() {
	defer close(a.done)
	var work []parse.Access
	keys := make([]uint64, 0, 64)
	todo := make([]pageid.Key, 0, 64)
	idx := make([]int, 0, 64)
	found := make([]bool, 64)
	for {
		select {
		case <-a.kick:
		case <-a.stop:
			return
		}
		a.mu.Lock()
		work, a.pending = a.pending, work[:0]
		a.mu.Unlock()
		for start := 0; start < len(work); start += 64 {
			batch := work[start:min(start+64, len(work))]
			keys, idx = keys[:0], idx[:0]
			for i, acc := range batch {
				switch acc.Kind {
				case parse.Read:
					keys = append(keys, uint64(acc.Key))
					idx = append(idx, i)
				case parse.Write:
					a.hv.Add(uint64(acc.Key))
				case parse.Delete:
					a.hv.Delete(uint64(acc.Key))
				}
			}
			a.hv.ContainsBatch(keys, found[:len(keys)])
			for j, k := range keys {
				if found[j] {
					a.Skipped.Add(1)
					continue
				}
				if kv := a.kernel.Load(); kv != nil && kv.Contains(k) {
					a.KernelSkipped.Add(1)
					continue
				}
				a.Prefetches.Add(1)
				if a.Resident != nil && a.Resident(pageid.Key(k)) {
					a.FalseNegatives.Add(1)
				}
				todo = append(todo, pageid.Key(k))
			}
			a.issue(todo)
			todo = todo[:0]
		}
	}
}

// issue prefetches keys, consecutive pages of a volume as runs (one
// request each) and the rest one by one.
func (a *Agent) issue(keys []pageid.Key) {
	for i := 0; i < len(keys); {
		j := i + 1
		for j < len(keys) && j-i < MaxRun && keys[j] == keys[j-1]+1 && keys[j].Volume() == keys[i].Volume() {
			j++
		}
		if j-i == 1 {
			a.engine.Prefetch(keys[i])
		} else {
			a.engine.PrefetchRun(keys[i], j-i)
		}
		i = j
	}
}

// SetKernelView gives the agent the Host View of the kernel page cache.
func (a *Agent) SetKernelView(kv *hostview.Set) { a.kernel.Store(kv) }

// Read-ahead sources: streams from different sources are told apart.
const (
	SourceFUSE     = iota // READs reaching the FUSE server
	SourceKernel          // reads the kernel page cache saw (tracker)
	SourceMirrored        // mirrored requests (NBD, page protocol), every connection
)

// ReadAhead tells the agent that source src read n pages from first, in
// a file that ends before page end (0: unknown). The sequential predictor
// prefetches past streams; the pages read themselves are already being
// served.
func (a *Agent) ReadAhead(src int, first pageid.Key, n int, end uint64) {
	var buf [256]pageid.Key
	keys := a.seq.Access(src, first, n, end, buf[:0])
	if len(keys) == 0 {
		return
	}
	p, _ := a.scratch.Get().(*[]parse.Access)
	if p == nil {
		p = new([]parse.Access)
	}
	acc := (*p)[:0]
	for _, k := range keys {
		acc = append(acc, parse.Access{Key: k, Kind: parse.Read})
	}
	a.enqueue(acc)
	*p = acc
	a.scratch.Put(p)
}

// Written tells the agent the host's cache took n pages from first through
// a write no parser saw (a FUSE WRITE): Host View adds them, as PD3's rule
// does for a parsed write, so the predictor does not prefetch pages the
// host holds. Queued lazily, ahead of any later read decision.
func (a *Agent) Written(first pageid.Key, n int) {
	var buf [64]parse.Access
	for n > 0 {
		m := min(n, len(buf))
		for i := range m {
			buf[i] = parse.Access{Key: pageid.MakeKey(first.Volume(), first.Page()+uint64(i)), Kind: parse.Write}
		}
		a.enqueueLazy(buf[:m])
		first, n = pageid.MakeKey(first.Volume(), first.Page()+uint64(m)), n-m
	}
}

// Prefetched adapts the Loading Zone to pagestore.Prefetched.
type Prefetched struct{ Z *loadingzone.Zone }

// CheckAndReturn implements pagestore.Prefetched.
func (p Prefetched) CheckAndReturn(k pageid.Key, dst []byte) int {
	return p.Z.CheckAndReturn(uint64(k), dst)
}
