package split

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/pd3-go/pd3/dpu"
	"github.com/pd3-go/pd3/dpu/mirror"
	"github.com/pd3-go/pd3/dpu/parse"
	"github.com/pd3-go/pd3/hostview"
	"github.com/pd3-go/pd3/internal/shm"
	"github.com/pd3-go/pd3/internal/shmring"
	"github.com/pd3-go/pd3/loadingzone"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
)

// The agent's side of split mode (message format: ringmsg.go). The agent
// process formats a region (CreateAgentRegion), builds its Host View,
// engine and agent over the region's Loading Zone — that wiring is the
// composition root's, host.RunAgent — and serves the host through the
// region (Serve).

// AgentRegion is a split-mode region as the agent process owns it: the
// rings and a Loading Zone formatted with a new epoch. Hosts attach only
// once Serve publishes it.
type AgentRegion struct {
	Zone  *loadingzone.Zone
	Epoch uint64

	name      string
	region    *shm.Region
	ringBytes int
	ra, rb    *shmring.Ring
}

// CreateAgentRegion creates /dev/shm/pd3-NAME with two rings of ringBytes
// and a Loading Zone of lzRecords pages.
func CreateAgentRegion(name string, ringBytes, lzRecords int) (*AgentRegion, error) {
	lay := layout(ringBytes, lzRecords)
	region, err := shm.Create(name, lay.total)
	if err != nil {
		return nil, err
	}
	r := &AgentRegion{name: name, region: region, ringBytes: ringBytes, Epoch: uint64(time.Now().UnixNano())}
	b := region.Bytes()
	if r.ra, err = shmring.Attach(b[lay.ringA:], ringBytes); err == nil {
		if r.rb, err = shmring.Attach(b[lay.ringB:], ringBytes); err == nil {
			r.Zone, err = loadingzone.Format(b[lay.lz:], lzRecords, r.Epoch)
		}
	}
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("dpu: region %s: %w", name, err)
	}
	shm.U64(b, offSRingSize).Store(uint64(ringBytes))
	shm.U64(b, offSRecords).Store(uint64(lzRecords))
	shm.U64(b, offSEpoch).Store(r.Epoch)
	return r, nil
}

// Close removes the region and unmaps it; a host attached to it sees the
// heartbeat stop and goes direct.
func (r *AgentRegion) Close() error {
	return errors.Join(r.region.Remove(), r.region.Close())
}

// HostService is what serves a host's messages through a region.
type HostService struct {
	Agent  *dpu.Agent
	Engine *dpu.Engine
	// Kernel is the Host View of the host's kernel page cache, kept from
	// the host's KERNEL messages.
	Kernel *hostview.Set
	// NBDParser makes the parser of a mirrored NBD connection.
	NBDParser func() parse.Parser
	// Workers is how many host reads and write-backs run at once
	// (default 64).
	Workers int
	// Ready, if set, is called once hosts can attach.
	Ready func()
}

// Serve publishes the region to hosts and serves them until ctx ends: the
// heartbeat, the dispatch of ring A's messages, and the workers that
// carry out host requests and reply on ring B.
func (r *AgentRegion) Serve(ctx context.Context, hs HostService) error {
	if hs.Workers <= 0 {
		hs.Workers = 64
	}
	a, e, kv, ra := hs.Agent, hs.Engine, hs.Kernel, r.ra
	b := r.region.Bytes()
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

	replies := &replier{r: r.rb}
	jobs := make(chan job, hs.Workers*4)
	for i := 0; i < hs.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				j.run(ctx, e, replies)
			}
		}()
	}
	if hs.Ready != nil {
		hs.Ready()
	}
	streams := map[uint32]mirror.Stream{}
	bufs := sync.Pool{New: func() any { return make([]byte, pageid.Size) }}
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
					st = a.Mirror(hs.NBDParser).NewStream()
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
				k := uint64(pageid.MakeKey(r.key.Volume(), r.key.Page()+i))
				if r.arg == kernelAdded {
					kv.Add(k)
				} else {
					kv.Delete(k)
				}
			}
		case msgResident:
			keys := make([]parse.Access, 0, len(r.keys)/8)
			for i := range len(r.keys) / 8 {
				keys = append(keys, parse.Access{Key: r.keyAt(i), Kind: parse.Write})
			}
			a.Enqueue(keys)
		case msgTrim, msgInvalidate, msgRead, msgWrite, msgFence:
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

func (j job) run(ctx context.Context, e *dpu.Engine, r *replier) {
	var err error
	var page []byte
	switch j.typ {
	case msgInvalidate:
		e.Invalidate(j.key)
	case msgTrim:
		err = e.Trim(ctx, j.vol, j.off, j.n)
	case msgFence:
		err = e.Fence(ctx, j.vol, j.off)
	case msgWrite:
		err = e.WritePages(ctx, []pageid.Key{j.key}, [][]byte{j.page})
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

// NBDResolver maps export names to volume ids by asking the memory node
// once per name ("" is the node's first volume): an agent process's NBD
// parsers resolve exports with it.
func NBDResolver(ctx context.Context, c *memnode.Client) func(string) (uint16, bool) {
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
