package host

import (
	"fmt"

	"github.com/pd3-go/pd3/dpu"
	"github.com/pd3-go/pd3/dpu/parse"
	"github.com/pd3-go/pd3/dpu/split"
	"github.com/pd3-go/pd3/hostview"
	"github.com/pd3-go/pd3/internal/shm"
	"github.com/pd3-go/pd3/loadingzone"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
)

// missPath is the Remote the store's misses take, from Config.DPU and
// Config.Prefetch (checked by Config.check): direct (the host reads for itself), the transfer engine over
// conn with the embedded agent or Leap, or a split agent's link with
// direct as its fallback.
func (h *Host) missPath(cfg Config, opt *pagestore.Options, conn dpu.Conn, direct pagestore.Remote) (pagestore.Remote, error) {
	remote := direct
	switch cfg.DPU.Kind {
	case AgentNone:
		if cfg.Prefetch == PrefetchLeap {
			if err := h.startEngine(cfg, opt, conn); err != nil {
				return nil, err
			}
			h.Leap = dpu.NewLeap(h.Zone.Hits.Load)
			remote = dpu.LeapRemote{Engine: h.Engine, L: h.Leap}
		}
	case AgentEmbedded:
		if err := h.startEngine(cfg, opt, conn); err != nil {
			return nil, err
		}
		h.Agent = dpu.NewAgent(h.HostView, h.Zone, h.Engine, func() parse.Parser { return new(parse.PageParser) })
		opt.OnEvict = h.Agent.Evicted
		remote = h.Engine
	case AgentSplit:
		// A separate agent process: the host keeps its direct memnode
		// connection for whenever the agent is absent or dead.
		h.Link = split.OpenLink(cfg.DPU.Region, direct)
		h.onClose(func() error { h.Link.Close(); return nil })
		opt.Prefetched = h.Link
		opt.OnEvict = h.Link.Evicted
		remote = h.Link
	}
	return remote, nil
}

// startEngine builds Host View, the Loading Zone (in an anonymous shared
// region) and the transfer engine, and points the store's miss path at the
// Loading Zone.
func (h *Host) startEngine(cfg Config, opt *pagestore.Options, conn dpu.Conn) error {
	lzBytes := cfg.LZBytes
	if lzBytes == 0 {
		lzBytes = 16 << 20
	}
	records := int(lzBytes / pageid.Size)
	if records < 1 {
		return fmt.Errorf("host: Loading Zone of %d bytes holds no page", lzBytes)
	}
	region, err := shm.Create("", loadingzone.Size(records))
	if err != nil {
		return fmt.Errorf("host: Loading Zone: %w", err)
	}
	z, err := loadingzone.Format(region.Bytes(), records, 1)
	if err != nil {
		region.Close()
		return fmt.Errorf("host: %w", err)
	}
	cache := cfg.CacheBytes
	if cache == 0 {
		cache = pagestore.DefaultCacheBytes
	}
	var hv *hostview.Set
	if cfg.DPU.Kind == AgentEmbedded {
		hv = hostview.New(int(cache/pageid.Size)+records+1024, 2)
		z.OnDrop = func(k uint64) { hv.Delete(k) }
	}
	h.Engine = dpu.NewEngine(conn, hv, z, 1024)
	h.Zone, h.HostView = z, hv
	h.onClose(region.Close)
	opt.Prefetched = dpu.Prefetched{Z: z}
	return nil
}

func (h *Host) stopAgent() {
	if h.Agent != nil {
		h.Agent.Close()
	}
	if h.Engine != nil {
		h.Engine.Close()
	}
}
