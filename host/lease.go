package host

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pd3-go/pd3/caslease"
	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/pageid"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
)

// leasesVolume holds one lease word per volume id at the memory node, and
// epochsVolume one counter per volume id: how many hosts have held it, the
// next holder's fencing token less one.
const (
	leasesVolume = "pd3.leases"
	epochsVolume = "pd3.epochs"
)

// leaseVolumes claims every served volume for this host (caslease.Lease on
// the volume's word of leasesVolume), waiting out a crashed holder's
// lease, and keeps the claims renewed. A claim lost to another host fences
// the volume: the two hosts' caches would otherwise each overwrite the
// other's writes.
func (h *Host) leaseVolumes(ctx context.Context, cfg Config) error {
	ttl := cfg.VolumeLease
	if ttl <= 0 {
		ttl = 5 * time.Second
	}
	if h.Replicated != nil {
		// No single node to count epochs at: the holds' etcd revisions
		// are the tokens.
		return h.holdVolumes(ctx, cfg, ttl, 0)
	}
	epochs, err := h.Client.OpenOrCreate(ctx, epochsVolume, 1<<16*8)
	if err != nil {
		return fmt.Errorf("host: volume fencing epochs: %w", err)
	}
	if cfg.Etcd.Enabled() {
		return h.holdVolumes(ctx, cfg, ttl, epochs.ID)
	}
	lv, err := h.Client.OpenOrCreate(ctx, leasesVolume, 1<<16*8)
	if err != nil {
		return fmt.Errorf("host: volume leases: %w", err)
	}
	for _, v := range h.Volumes {
		l := &caslease.Lease{C: h.Client, Vol: lv.ID, Off: uint64(v.ID) * 8, TTL: ttl}
		if err := l.Acquire(ctx, ttl+time.Second); err != nil {
			return fmt.Errorf("host: volume %q is served by another host: %w", v.Name, err)
		}
		h.leases = append(h.leases, volumeLease{v: v, l: l, release: l.Release})
		if err := h.presentToken(ctx, v, epochs.ID, nil); err != nil {
			return err
		}
	}
	log := cfg.Log
	stop, done := make(chan struct{}), make(chan struct{})
	h.stopLeases = func() { close(stop); <-done }
	go func() {
		defer close(done)
		t := time.NewTicker(ttl / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			for _, vl := range h.leases {
				if h.Store.Fenced(vl.v.ID) {
					continue
				}
				rctx, cancel := context.WithTimeout(ctx, ttl)
				err := vl.l.Renew(rctx)
				cancel()
				switch {
				case errors.Is(err, pageid.ErrHeld):
					h.Store.FenceVolume(vl.v.ID)
					log.Error("host: another host took the volume over; no longer serving it", "volume", vl.v.Name, "err", err)
				case errors.Is(err, pageid.ErrClosed), ctx.Err() != nil:
					// Shutting down: renewing could only fail from now on.
					return
				case err != nil:
					log.Warn("host: volume lease renewal", "volume", vl.v.Name, "err", err)
				}
			}
		}
	}()
	return nil
}

type volumeLease struct {
	v       pageid.VolumeInfo
	l       *caslease.Lease // nil when etcd holds the volume
	release func(context.Context) error
}

// presentToken takes volume v's next fencing token — one more than the
// last holder's, counted at the node in epochsVolume, so it survives
// whatever happens to the lease's own store — and presents it on every
// connection that writes the volume back. The node then refuses the
// write-backs a superseded host (one partitioned past its lease) still
// has in flight.
func (h *Host) presentToken(ctx context.Context, v pageid.VolumeInfo, epochs uint16, hold *cluster.Hold) error {
	var tok uint64
	var err error
	if h.Replicated != nil {
		tok = hold.Token()
	} else {
		tok, err = h.takeToken(ctx, epochs, v.ID)
	}
	if err == nil {
		err = h.present(ctx, v.ID, tok)
	}
	if err != nil {
		return fmt.Errorf("host: volume %q: presenting the lease's fencing token: %w", v.Name, err)
	}
	return nil
}

// takeToken takes the next fencing token of volume id: one more than the
// count of its holders so far, kept in the epochs volume.
func (h *Host) takeToken(ctx context.Context, epochs, id uint16) (uint64, error) {
	prev, err := h.Client.FetchAndAdd(ctx, epochs, uint64(id)*8, 1)
	return prev + 1, err
}

// present presents token for volume vol on every connection this host
// writes through: its own, and the split agent's.
func (h *Host) present(ctx context.Context, vol uint16, token uint64) error {
	if h.Coded != nil && h.Coded.Has(vol) {
		return h.Coded.Fence(ctx, vol, token)
	}
	if h.Replicated != nil {
		return h.Replicated.Fence(ctx, vol, token)
	}
	if err := h.Client.Fence(ctx, vol, token); err != nil {
		return err
	}
	if h.Link != nil {
		return h.Link.Fence(ctx, vol, token)
	}
	return nil
}

// holdVolumes takes every served volume through the control plane: an
// etcd mutex per volume under this host's session, waiting out at most
// one session of a crashed holder. A session that expires (etcd did not
// hear from this host for ttl) fences every volume: another host may hold
// them by now.
func (h *Host) holdVolumes(ctx context.Context, cfg Config, ttl time.Duration, epochs uint16) error {
	cli, err := cluster.Dial(ctx, cfg.Etcd)
	if err != nil {
		return fmt.Errorf("host: %w", err)
	}
	// Closed by releaseVolumes once the holds are released: ending the
	// session first would look like losing it.
	h.closeControl = func(context.Context) error { return cli.Close() }
	ch, err := cluster.NewHost(ctx, cli, cfg.Cluster, ttl)
	if err != nil {
		return fmt.Errorf("host: %w", err)
	}
	h.closeControl = func(ctx context.Context) error { return errors.Join(ch.CloseContext(ctx), cli.Close()) }
	h.control, h.ttl, h.epochs = ch, ttl, epochs
	// While the host does not know whether it still holds its volumes,
	// it serves nothing; a no fences them below, then lets the held
	// requests fail.
	ch.SetDoubt(func(doubting bool) {
		if doubting {
			h.Store.Suspend()
		} else {
			h.Store.Resume()
		}
	})
	node := nodeOf(ctx, cli, cfg)
	// The volumes are held side by side: each hold, record and token is
	// a few etcd and node round trips, which etcd commits together, so a
	// host of a thousand volumes starts in seconds, not tens of them.
	leases := make([]volumeLease, len(h.Volumes))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(openWorkers)
	for i, v := range h.Volumes {
		g.Go(func() error {
			// Twice the TTL: an etcd that restarted (pd3 up --persist
			// after a crash) gives the dead holder's session a whole TTL
			// again.
			hold, err := ch.Hold(gctx, v.Name, 2*ttl+time.Second)
			if err != nil {
				return fmt.Errorf("host: volume %q is served by another host: %w", v.Name, err)
			}
			leases[i] = volumeLease{v: v, release: hold.Release}
			if err := recordVolume(gctx, cli, cfg, node, v); err != nil {
				return err
			}
			if err := h.presentToken(gctx, v, epochs, hold); err != nil {
				return err
			}
			if h.Coded != nil && h.Coded.Has(v.ID) {
				release, err := h.openCoded(gctx, cli, cfg, v)
				if err != nil {
					return err
				}
				leases[i].release = func(ctx context.Context) error { return errors.Join(release(ctx), hold.Release(ctx)) }
			}
			return nil
		})
	}
	err = g.Wait()
	for _, l := range leases {
		if l.release != nil { // held: released when the host stops
			h.leases = append(h.leases, l)
		}
	}
	if err != nil {
		return err
	}
	stop, done := make(chan struct{}), make(chan struct{})
	h.stopLeases = func() { close(stop); <-done }
	go func() {
		defer close(done)
		select {
		case <-stop:
		case <-ch.Lost():
			for _, vl := range h.leases {
				h.Store.FenceVolume(vl.v.ID)
			}
			if f := h.heldFS.Load(); f != nil {
				f.Fence()
			}
			h.Store.Resume()
			cfg.Log.Error("host: the control plane lost this host's session; no longer serving its volumes", "etcd", strings.Join(cfg.Etcd.Endpoints, ","))
		}
	}()
	return nil
}

// holdFS holds filesystem cfg.FSName in the control plane, as volumes
// are held, and has the mount take a fencing token from the epochs volume
// and present it on every volume the filesystem writes: the memory node
// then refuses a superseded mount's late writes, files and metadata alike.
func (h *Host) holdFS(ctx context.Context, cfg Config, fcfg *fs.Config) error {
	hold, err := h.control.Hold(ctx, "fs."+cfg.FSName, 2*h.ttl+time.Second)
	if err != nil {
		return fmt.Errorf("host: fs %q: %w: %w", cfg.FSName, fs.ErrMounted, err)
	}
	h.fsHold = hold.Release
	fcfg.Fencing = &fs.Fencing{
		Token:   func(ctx context.Context, meta uint16) (uint64, error) { return h.takeToken(ctx, h.epochs, meta) },
		Present: h.present,
	}
	if h.Replicated != nil {
		// No epochs volume over many nodes: the hold's revision in etcd
		// is newer than any earlier holder's.
		fcfg.Fencing.Token = func(context.Context, uint16) (uint64, error) { return hold.Token(), nil }
	}
	return nil
}

// recordVolume makes sure the control plane has a record of volume v,
// held by this host: one is written for a volume created here (or before
// the records existed). A volume being removed (pd3 volume rm) is not
// served.
func recordVolume(ctx context.Context, cli *clientv3.Client, cfg Config, node string, v pageid.VolumeInfo) error {
	rec := cluster.VolumeRecord{Name: v.Name, ID: v.ID, Size: v.Size, PageSize: pageid.Size, NodeAddr: cfg.Memnode, Node: node}
	got, err := cluster.EnsureVolume(ctx, cli, cfg.Cluster, rec)
	if err != nil {
		return fmt.Errorf("host: %w", err)
	}
	switch {
	case got.State == cluster.VolumeDeleting:
		return fmt.Errorf("host: volume %q is being removed (pd3 volume rm): not serving it", v.Name)
	case got.State == cluster.VolumeResizing:
		return fmt.Errorf("host: volume %q is being resized (pd3 volume resize): not serving it; start again once that is done", v.Name)
	case got.Size > v.Size:
		// Grown between this host's open and its hold: what it serves is
		// a prefix of the volume, so nothing is wrong, only smaller.
		cfg.Log.Warn(fmt.Sprintf("volume %s was resized to %s while this host opened it: serving %s until restarted",
			v.Name, units.FormatSize(got.Size), units.FormatSize(v.Size)))
	}
	return nil
}

// nodeOf is the cluster's id of the node at cfg.Memnode ("" when it has
// none, or for striped volumes, which name their nodes in their maps).
func nodeOf(ctx context.Context, cli *clientv3.Client, cfg Config) string {
	if cfg.Memnode == "" {
		return ""
	}
	nodes, err := cluster.Nodes(ctx, cli, cfg.Cluster)
	if err != nil {
		return ""
	}
	for _, n := range nodes {
		if n.Addr == cfg.Memnode {
			return n.ID
		}
	}
	return ""
}

// openWorkers bounds the volumes a host opens, holds or releases at once.
const openWorkers = 16

// releaseVolumes stops the renewals and gives the leases up; it runs
// after the dirty pages are written back, so the next holder reads them.
func (h *Host) releaseVolumes() error {
	if h.stopLeases != nil {
		h.stopLeases()
		h.stopLeases = nil
		if h.Store != nil {
			h.Store.Resume() // a doubt cut short by the stop: nothing serves any more
		}
	}
	// One deadline for everything the control plane is told at a stop:
	// an etcd that is gone costs the stop 5 s, not 5 s a step.
	const patience = 5 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	errs := make([]error, len(h.leases), len(h.leases)+2)
	var g errgroup.Group
	g.SetLimit(openWorkers)
	for i, vl := range h.leases {
		if h.Store != nil && h.Store.Fenced(vl.v.ID) {
			continue
		}
		g.Go(func() error { errs[i] = vl.release(ctx); return nil })
	}
	g.Wait()
	h.leases = nil
	if h.fsHold != nil {
		if f := h.heldFS.Load(); f == nil || !f.Fenced() {
			errs = append(errs, h.fsHold(ctx))
		}
		h.fsHold = nil
	}
	if h.closeControl != nil {
		errs = append(errs, h.closeControl(ctx))
		h.closeControl = nil
	}
	err := errors.Join(errs...)
	if err != nil && ctx.Err() != nil {
		// Not a list of "context deadline exceeded": what it means.
		who := "the memory node"
		if h.control != nil {
			who = "etcd"
		}
		return fmt.Errorf("host: %s did not answer within %v, so this host's holds on its volumes were not given back: they expire on their own when their lease runs out (%w)",
			who, patience, ctx.Err())
	}
	return err
}
