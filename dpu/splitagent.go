package dpu

import (
	"context"
	"runtime"
	"sync"
	"time"

	"github.com/pd3-go/pd3/dpu/mirror"
	"github.com/pd3-go/pd3/hostview"
	"github.com/pd3-go/pd3/internal/shm"
	"github.com/pd3-go/pd3/internal/shmring"
	"github.com/pd3-go/pd3/loadingzone"
	"github.com/pd3-go/pd3/memnode"
)

// The agent's side of split mode: RunSplitAgent formats the region and
// serves the host's requests from ring A (message format: ringmsg.go).

// SplitAgentConfig configures RunSplitAgent.
type SplitAgentConfig struct {
	Name        string          // region name: /dev/shm/pd3-NAME
	Client      *memnode.Client // the agent's memnode connection
	LZRecords   int             // Loading Zone pages (default 4096)
	HostPages   int             // host cache pages, to size Host View (default 16384)
	RingBytes   int             // per ring (default 8 MiB)
	Workers     int             // goroutines executing host reads/writes (default 64)
	MaxInFlight int             // prefetches in flight (default 1024)
}

// SplitAgent is a running agent process's state (exposed for metrics).
type SplitAgent struct {
	Agent  *Agent
	Engine *Engine
	Zone   *loadingzone.Zone
	HV     *hostview.Set
	Kernel *hostview.Set // the host's kernel page cache (FUSE files)
	Epoch  uint64
	c      *memnode.Client
}

// Mirror returns a mirror for client connections speaking proto
// (ProtoPage or ProtoNBD) that the agent watches itself — the packet
// mirror — rather than through the host's ring.
func (s *SplitAgent) Mirror(ctx context.Context, proto byte) mirror.Mirror {
	if proto == ProtoNBD {
		return s.Agent.Mirror(func() Parser { return &NBDParser{Resolve: resolver(ctx, s.c)} })
	}
	return s.Agent
}

// RunSplitAgent creates the region and serves the host through it until
// ctx ends. ready, if non-nil, receives the agent's state once it serves.
func RunSplitAgent(ctx context.Context, cfg SplitAgentConfig, ready func(*SplitAgent)) error {
	if cfg.LZRecords <= 0 {
		cfg.LZRecords = 4096
	}
	if cfg.HostPages <= 0 {
		cfg.HostPages = 16384
	}
	if cfg.RingBytes <= 0 {
		cfg.RingBytes = 8 << 20
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 64
	}
	lay := layout(cfg.RingBytes, cfg.LZRecords)
	region, err := shm.Create(cfg.Name, lay.total)
	if err != nil {
		return err
	}
	defer region.Close()
	defer region.Remove()
	b := region.Bytes()
	epoch := uint64(time.Now().UnixNano())
	ra, err := shmring.Attach(b[lay.ringA:], cfg.RingBytes)
	if err != nil {
		return err
	}
	rb, err := shmring.Attach(b[lay.ringB:], cfg.RingBytes)
	if err != nil {
		return err
	}
	z, err := loadingzone.Format(b[lay.lz:], cfg.LZRecords, epoch)
	if err != nil {
		return err
	}
	hv := hostview.New(cfg.HostPages+cfg.LZRecords+1024, 2)
	z.OnDrop = func(k uint64) { hv.Delete(k) }
	e := NewEngine(cfg.Client, hv, z, cfg.MaxInFlight)
	defer e.Close()
	a := NewAgent(hv, z, e, func() Parser { return new(PageParser) })
	defer a.Close()
	kv := hostview.New(cfg.HostPages+cfg.LZRecords+1024, 2)
	a.SetKernelView(kv)

	shm.U64(b, offSRingSize).Store(uint64(cfg.RingBytes))
	shm.U64(b, offSRecords).Store(uint64(cfg.LZRecords))
	shm.U64(b, offSEpoch).Store(epoch)
	shm.U64(b, offSMagic).Store(splitMagic) // last: the region is complete
	beat := shm.U64(b, offSBeat)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(heartbeatEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				beat.Add(1)
			}
		}
	}()

	replies := &replier{r: rb}
	jobs := make(chan job, cfg.Workers*4)
	for i := 0; i < cfg.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				j.run(ctx, e, replies)
			}
		}()
	}
	if ready != nil {
		ready(&SplitAgent{Agent: a, Engine: e, Zone: z, HV: hv, Kernel: kv, Epoch: epoch, c: cfg.Client})
	}
	streams := map[uint32]mirror.Stream{}
	bufs := sync.Pool{New: func() any { return make([]byte, memnode.PageSize) }}
	for ctx.Err() == nil {
		m := ra.Next()
		if m == nil {
			ra.Wait(10 * time.Millisecond)
			continue
		}
		r, err := decodeRequest(m)
		if err != nil {
			// The ring's framing holds; only this message is lost (a
			// host of another build would not have attached).
			ra.Release()
			continue
		}
		switch r.typ {
		case msgMirror:
			st, ok := streams[r.tag]
			if !ok {
				if r.arg == ProtoNBD {
					st = a.newStream(func() Parser { return &NBDParser{Resolve: resolver(ctx, cfg.Client)} })
				} else {
					st = a.NewStream()
				}
				streams[r.tag] = st
			}
			st.Observe(r.data)
		case msgClose:
			if st, ok := streams[r.tag]; ok {
				st.Close()
				delete(streams, r.tag)
			}
		case msgEvict:
			for i := range len(r.keys) / 8 {
				a.Evicted(r.keyAt(i))
			}
		case msgWritten:
			a.Written(r.key, int(r.n))
		case msgReadAhead:
			a.ReadAhead(int(r.arg), r.key, int(r.n), r.off)
		case msgKernel:
			for i := range r.n {
				k := uint64(memnode.MakeKey(r.key.Volume(), r.key.Page()+i))
				if r.arg == kernelAdded {
					kv.Add(k)
				} else {
					kv.Delete(k)
				}
			}
		case msgResident:
			keys := make([]Access, 0, len(r.keys)/8)
			for i := range len(r.keys) / 8 {
				keys = append(keys, Access{r.keyAt(i), Write})
			}
			a.enqueue(keys)
		case msgTrim, msgInvalidate, msgRead, msgWrite:
			j := job{ringMsg: r, free: &bufs}
			if r.typ == msgWrite {
				// The ring slot is released below; the job keeps a copy.
				j.page = bufs.Get().([]byte)
				copy(j.page, r.page)
			}
			jobs <- j
		}
		ra.Release()
	}
	close(jobs)
	wg.Wait()
	return nil
}

// job is a host request the agent's workers carry out: the decoded
// message, with a WRITE's page copied out of the ring.
type job struct {
	ringMsg
	free *sync.Pool
}

func (j job) run(ctx context.Context, e *Engine, r *replier) {
	var err error
	var page []byte
	switch j.typ {
	case msgInvalidate:
		e.Invalidate(j.key)
	case msgTrim:
		err = e.Trim(ctx, j.vol, j.off, j.n)
	case msgWrite:
		err = e.WritePages(ctx, []memnode.Key{j.key}, [][]byte{j.page})
		j.free.Put(j.page)
	case msgRead:
		page = j.free.Get().([]byte)
		defer j.free.Put(page)
		if err = e.ReadPage(ctx, j.key, page); err != nil {
			page = nil
		}
	}
	hdr := encodeHeader(msgHeader{typ: j.typ, arg: byte(replyStatus(err)), tag: j.tag})
	r.send(ctx, hdr[:], page)
}

// replier serialises the agent's replies into ring B.
type replier struct {
	mu sync.Mutex
	r  *shmring.Ring
}

func (r *replier) send(ctx context.Context, parts ...[]byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for !r.r.Send(parts...) {
		if ctx.Err() != nil {
			return
		}
		runtime.Gosched() // the host drains replies; this is brief
	}
}

// resolver maps export names to volume ids by asking the memory node once
// per name ("" is the node's first volume).
func resolver(ctx context.Context, c *memnode.Client) func(string) (uint16, bool) {
	cache := map[string]uint16{}
	return func(name string) (uint16, bool) {
		if id, ok := cache[name]; ok {
			return id, true
		}
		var id uint16
		if name == "" {
			vs, err := c.List(ctx)
			if err != nil || len(vs) == 0 {
				return 0, false
			}
			id = vs[0].ID
		} else {
			v, err := c.Open(ctx, name)
			if err != nil {
				return 0, false
			}
			id = v.ID
		}
		cache[name] = id
		return id, true
	}
}
