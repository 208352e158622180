package host

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/pd3-go/pd3/dpu"
	"github.com/pd3-go/pd3/dpu/mirror"
	"github.com/pd3-go/pd3/dpu/mirror/packet"
	"github.com/pd3-go/pd3/dpu/parse"
	"github.com/pd3-go/pd3/dpu/split"
	"github.com/pd3-go/pd3/hostview"
	"github.com/pd3-go/pd3/internal/tlsfiles"
	"github.com/pd3-go/pd3/loadingzone"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
)

// AgentConfig configures a DPU agent process (pd3 dpu): split mode, the
// host attaching with --dpu shm:NAME.
type AgentConfig struct {
	Name    string // region name: /dev/shm/pd3-NAME
	Memnode string // memory node address
	Token   string
	// MemnodeTLS, if enabled, makes the link to the memory node TLS (as
	// Config.MemnodeTLS).
	MemnodeTLS tlsfiles.Files
	// LZBytes is the Loading Zone size (default 16 MiB); CacheBytes the
	// host's cache size, which sizes Host View (default 64 MiB).
	LZBytes, CacheBytes uint64
	RingBytes           int // per ring (default 8 MiB)
	Workers             int // host reads and write-backs at once (default 64)
	// Captures are host servers whose client traffic the agent watches
	// itself on AF_PACKET sockets (the packet mirror).
	Captures []Capture
	// Metrics, if set, serves the agent's Prometheus metrics there.
	Metrics string
	Log     *slog.Logger
}

// Capture is a server whose requests the agent captures: Proto is
// split.ProtoPage or split.ProtoNBD.
type Capture struct {
	Proto byte
	Addr  string
}

// Agent is a running agent process's state, handed to RunAgent's ready.
type Agent struct {
	Agent       *dpu.Agent
	Engine      *dpu.Engine
	Zone        *loadingzone.Zone
	HostView    *hostview.Set
	Kernel      *hostview.Set // the host's kernel page cache (FUSE files)
	Epoch       uint64
	MetricsAddr string // "" without Metrics
}

// RunAgent connects to the memory node, builds the agent over a new
// region (Host View, Loading Zone, transfer engine, parsers), starts the
// packet captures and metrics asked for, and serves the host until ctx
// ends; ready, if set, is called once it serves. Everything it started is
// stopped before it returns.
func RunAgent(ctx context.Context, cfg AgentConfig, ready func(*Agent)) error {
	log := cmp.Or(cfg.Log, slog.Default())
	lzRecords := int(cmp.Or(cfg.LZBytes, 16<<20) / pageid.Size)
	hostPages := int(cmp.Or(cfg.CacheBytes, 64<<20) / pageid.Size)
	if cfg.Memnode == "" {
		return errors.New("agent: no memory node address")
	}
	copt := memnode.ClientOptions{Token: cfg.Token, OpTimeout: 30 * time.Second}
	var err error
	if copt.TLS, err = memnodeTLS(cfg.MemnodeTLS); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	c, err := memnode.Dial(ctx, cfg.Memnode, copt)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer c.Close()
	region, err := split.CreateAgentRegion(cfg.Name, cmp.Or(cfg.RingBytes, 8<<20), lzRecords)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer region.Close()
	s := &Agent{Zone: region.Zone, Epoch: region.Epoch}
	// Host View holds what the host caches and what waits in the Loading
	// Zone for it; a page leaving the zone unconsumed leaves Host View.
	s.HostView = hostview.New(hostPages+lzRecords+1024, 2)
	region.Zone.OnDrop = func(k uint64) { s.HostView.Delete(k) }
	s.Engine = dpu.NewEngine(dpu.NodeConn{Client: c}, s.HostView, region.Zone, 0)
	defer s.Engine.Close()
	s.Agent = dpu.NewAgent(s.HostView, region.Zone, s.Engine, func() parse.Parser { return new(parse.PageParser) })
	defer s.Agent.Close()
	s.Kernel = hostview.New(hostPages+lzRecords+1024, 2)
	s.Agent.SetKernelView(s.Kernel)
	resolve := split.NBDResolver(ctx, c)
	nbdParser := func() parse.Parser { return &parse.NBDParser{Resolve: resolve} }

	var wg sync.WaitGroup
	defer wg.Wait() // the captures end before the agent and region close
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // first: it ends the captures
	for _, t := range cfg.Captures {
		var m mirror.Mirror = s.Agent
		if t.Proto == split.ProtoNBD {
			m = s.Agent.Mirror(nbdParser)
		}
		pc, err := packet.ListenAddr(t.Addr, m)
		if err != nil {
			return fmt.Errorf("agent: watching %s: %w", t.Addr, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pc.Run(ctx); err != nil {
				log.Error(err.Error())
			}
		}()
	}
	if cfg.Metrics != "" {
		m := NewMetrics()
		m.RegisterAgent(s.Agent, s.Engine, s.Zone, s.HostView)
		addr, closer, err := ServeRegistry(ctx, cfg.Metrics, m.R)
		if err != nil {
			return fmt.Errorf("agent: %w", err)
		}
		defer closer()
		s.MetricsAddr = addr
	}
	return region.Serve(ctx, split.HostService{
		Agent: s.Agent, Engine: s.Engine, Kernel: s.Kernel, NBDParser: nbdParser, Workers: cfg.Workers,
		Ready: func() {
			if ready != nil {
				ready(s)
			}
		},
	})
}
