package host

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/caslease"
	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/dpu"
	"github.com/pd3-go/pd3/dpu/mirror"
	"github.com/pd3-go/pd3/dpu/mirror/packet"
	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/hostview"
	"github.com/pd3-go/pd3/hostview/pagecache"
	"github.com/pd3-go/pd3/internal/netsrv"
	"github.com/pd3-go/pd3/internal/procgov"
	"github.com/pd3-go/pd3/internal/shm"
	"github.com/pd3-go/pd3/internal/sockio"
	"github.com/pd3-go/pd3/internal/stages"
	"github.com/pd3-go/pd3/internal/tlsfiles"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/internal/workload"
	"github.com/pd3-go/pd3/loadingzone"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/nbd"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
	"github.com/pd3-go/pd3/pagestore/pageproto"
	"github.com/pd3-go/pd3/replica"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// VolumeSpec names a volume and its size.
type VolumeSpec struct {
	Name string
	Size uint64
}

// ParseVolume reads NAME:SIZE (e.g. disk0:1GiB).
func ParseVolume(s string) (VolumeSpec, error) {
	name, size, ok := strings.Cut(s, ":")
	if !ok || name == "" {
		return VolumeSpec{}, fmt.Errorf("bad volume %q: want NAME:SIZE, e.g. disk0:1GiB", s)
	}
	n, err := units.ParseMultiple(size, pageid.Size)
	if err != nil {
		return VolumeSpec{}, fmt.Errorf("volume %q: %w", name, err)
	}
	if n == 0 {
		return VolumeSpec{}, fmt.Errorf("volume %q: size must be positive", name)
	}
	return VolumeSpec{Name: name, Size: n}, nil
}

// Listen opens "host:port" or "unix:/path" (removing a stale socket file).
func Listen(addr string) (net.Listener, error) {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		if fi, err := os.Stat(p); err == nil && fi.Mode()&os.ModeSocket != 0 {
			os.Remove(p)
		}
		return net.Listen("unix", p)
	}
	return net.Listen("tcp", addr)
}

// NBDURI is the URI clients use for export on an NBD server at addr:
// nbd://HOST:PORT/EXPORT, or nbd+unix:///EXPORT?socket=PATH for
// "unix:PATH" (the NBD URI standard, as libnbd and qemu read it).
func NBDURI(addr, export string) string {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		// Escape what would end or change the query value; keep the
		// path's slashes readable.
		esc := strings.NewReplacer("%", "%25", "&", "%26", "#", "%23", "+", "%2B", " ", "%20")
		return "nbd+unix:///" + url.PathEscape(export) + "?socket=" + esc.Replace(p)
	}
	return "nbd://" + addr + "/" + url.PathEscape(export)
}

func addrString(ln net.Listener) string {
	if ln.Addr().Network() == "unix" {
		return "unix:" + ln.Addr().String()
	}
	return ln.Addr().String()
}

// MemnodeConfig configures a memory node.
type MemnodeConfig struct {
	Listen string // default 127.0.0.1:0
	Token  string
	// TLS, if enabled, serves TLS with TLS.Cert and TLS.Key; with TLS.CA,
	// clients must present certificates it signed (mutual TLS).
	TLS tlsfiles.Files
	// Etcd, if enabled, is the control plane: the node registers in
	// cluster Cluster (default "pd3") and stays alive there until it
	// stops (package cluster). Its id is kept in Persist, if set.
	Etcd    cluster.Access
	Cluster string
	// Grants are tokens limited to some volumes (memnode.Grant).
	Grants   []memnode.Grant
	Capacity uint64 // bytes of page memory; 0 = unlimited
	// PollFor is how long a connection polls for its next request before
	// it sleeps (memnode.Server.PollFor): 0 = memnode.DefaultPollFor,
	// negative = sleep at once.
	PollFor time.Duration
	// Persist, if set, is a directory that makes the node durable: an
	// acknowledged write survives a crash or power loss.
	Persist string
	// Progress, if set, is told how the recovery of a Persist directory
	// advances (memnode.OpenPersistentProgress).
	Progress memnode.Progress
	Log      *slog.Logger
	// Stages, if set, receives the node's stamps of a request's path
	// (the miss-path breakdown; nil in production).
	Stages *stages.Recorder
}

// pollFor maps MemnodeConfig.PollFor to memnode.Server.PollFor.
func pollFor(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return memnode.DefaultPollFor
	case d < 0:
		return 0
	}
	return d
}

// Memnode is a running memory node.
type Memnode struct {
	Server *memnode.Server
	Addr   string
	// ID is the node's id in the cluster ("" without Etcd).
	ID   string
	done chan error
	reg  *cluster.Registration
	etcd *clientv3.Client

	closeOnce sync.Once
	closeErr  error
}

// StartMemnode listens and serves in the background.
func StartMemnode(ctx context.Context, cfg MemnodeConfig) (*Memnode, error) {
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	var tlsCfg *tls.Config
	if cfg.TLS.Enabled() {
		var err error
		if tlsCfg, err = cfg.TLS.Server(); err != nil {
			return nil, fmt.Errorf("memory node: %w", err)
		}
	}
	store := memnode.NewStore(cfg.Capacity)
	if cfg.Persist != "" {
		var err error
		if store, err = memnode.OpenPersistentProgress(cfg.Persist, cfg.Capacity, cfg.Progress); err != nil {
			return nil, fmt.Errorf("memory node: %w", err)
		}
	}
	ln, err := Listen(cfg.Listen)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("memory node: %w", err)
	}
	m := &Memnode{
		Server: &memnode.Server{Store: store, Token: cfg.Token, Grants: cfg.Grants, Log: cfg.Log, Stages: cfg.Stages, TLS: tlsCfg,
			PollFor: pollFor(cfg.PollFor)},
		Addr: addrString(ln),
		done: make(chan error, 1),
	}
	go func() { m.done <- m.Server.Serve(ctx, ln) }()
	if cfg.Etcd.Enabled() {
		if err := m.register(ctx, cfg); err != nil {
			m.Close()
			return nil, fmt.Errorf("memory node: %w", err)
		}
	}
	return m, nil
}

// register records the node in the cluster; it is up from then on.
func (m *Memnode) register(ctx context.Context, cfg MemnodeConfig) error {
	id, err := cluster.NodeID(cfg.Persist)
	if err != nil {
		return err
	}
	if m.etcd, err = cluster.Dial(ctx, cfg.Etcd); err != nil {
		return err
	}
	store := m.Server.Store
	m.reg, err = cluster.Register(ctx, m.etcd, cluster.NodeRecord{ID: id, Addr: m.Addr, Capacity: cfg.Capacity},
		cluster.RegisterOptions{Cluster: cfg.Cluster, Persistent: cfg.Persist != "", Stored: store.Used, Log: cfg.Log})
	if err != nil {
		return err
	}
	m.ID = id
	return nil
}

// Close stops the node; without persistence its memory is gone, with it
// the node checkpoints. Calling it again returns the first answer.
func (m *Memnode) Close() error {
	m.closeOnce.Do(func() {
		var regErr error
		if m.reg != nil {
			regErr = m.reg.Close() // down in the cluster before it stops serving
		}
		if m.etcd != nil {
			m.etcd.Close()
		}
		m.Server.Close()
		err := closedByUs(<-m.done)
		m.closeErr = errors.Join(regErr, err, m.Server.Store.Close())
	})
	return m.closeErr
}

// closedByUs drops the error a server's Serve returns when Close came
// before Serve first ran (a SIGTERM right after start): the stop was ours,
// and reporting it as a failure would make systemd record a failed service.
func closedByUs(err error) error {
	if errors.Is(err, netsrv.ErrClosed) || errors.Is(err, pageid.ErrClosed) {
		return nil
	}
	return err
}

// Config configures a host.
type Config struct {
	Memnode string // memory node address (required unless Local)
	// Local keeps the volumes in host memory (pagestore.MemRemote) with a
	// cache as large as all of them: the "local" baseline of the benchmarks.
	Local bool
	Token string
	// Etcd, if enabled, is the control plane: volumes are held there (an
	// etcd mutex per volume under this host's session) instead of by
	// leases at the memory node; Cluster names the cluster (default "pd3").
	Etcd    cluster.Access
	Cluster string
	// MemnodeTLS, if enabled, makes the link to the memory node TLS: CA
	// verifies the node, Cert and Key are the host's identity.
	MemnodeTLS tlsfiles.Files
	Volumes    []VolumeSpec // created when missing, reopened when present
	CacheBytes int64
	Policy     string
	PageListen string // page-protocol address; "" = no page server
	NBDListen  string // NBD address; "" = no NBD server
	// NBDPollFor is how long an NBD connection polls for its next
	// request after a hit before it sleeps (nbd.Server.PollFor); 0 sleeps
	// at once.
	NBDPollFor time.Duration
	// NBDStreamFrom: NBD reads of at least this many bytes are not
	// cached (nbd.Server.StreamFrom); 0 caches every read.
	NBDStreamFrom uint32
	// LoneProcs, if above zero, is the GOMAXPROCS the process runs with
	// while its front ends answer reads from the cache one at a time
	// (procgov); zero keeps the process's GOMAXPROCS. One host per
	// process: the pd3 command sets it, tests that run several hosts in
	// one process leave it zero.
	LoneProcs int
	// NBDReadOnly names volumes exported read-only over NBD.
	NBDReadOnly []string
	// NBDTLS is whether the NBD server speaks TLS. NBDTLSCertificates is
	// the directory in nbdkit's layout: server-cert.pem and
	// server-key.pem, and ca-cert.pem to verify client certificates
	// given (RequireClientCert: clients must give one).
	NBDTLS             TLSMode
	NBDTLSCertificates string
	RequireClientCert  bool
	// DPU is where the agent runs; the zero value is no agent (every
	// miss is a direct memory-node read).
	DPU AgentMode
	// LZBytes is the Loading Zone size with an agent (default 16 MiB).
	LZBytes int64
	// Writeback, if > 0, writes dirty pages back at this interval (and
	// retries after a memory-node outage) without waiting for a FLUSH.
	Writeback time.Duration
	// Prefetch is a host-side prefetcher, for a host without an agent.
	Prefetch  Prefetcher
	Workers   int
	OpTimeout time.Duration
	// Mount, if set, mounts the FUSE filesystem FSName there.
	Mount   string
	FSName  string
	FSLease time.Duration
	// VolumeLease is how long this host's claim on each volume it serves
	// lasts without renewal (default 5 s): a second host serving the same
	// volume is refused, and after a crash the next host waits it out.
	VolumeLease time.Duration
	// Mirror is how the agent sees client requests (the zero value is
	// MirrorTap).
	Mirror Mirror
	// KernelViewPages sizes the Host View of the kernel page cache
	// (default 1 Mi pages: 4 GiB of cached file data).
	KernelViewPages int
	// Replicas, if > 0 (with Etcd), serves volumes striped over every
	// memory node of the cluster, each extent on this many nodes (fewer
	// if fewer are up); Memnode is then unused. 0: volumes live on the
	// one node Memnode.
	Replicas int
	// RepairRate bounds the bytes a second a host copies to restore
	// replicas lost with a node (0: no bound).
	RepairRate int64
	Log        *slog.Logger
	// Stages, if set, receives the host's stamps of a request's path
	// (the miss-path breakdown; nil in production).
	Stages *stages.Recorder
}

// Host is a running host: cache, remote client and frontends.
type Host struct {
	Client   *memnode.Client
	Store    *pagestore.Store
	Page     *pageproto.Server
	PageAddr string
	NBD      *nbd.Server
	NBDAddr  string
	Volumes  []pageid.VolumeInfo
	Agent    *dpu.Agent  // nil without an agent
	Engine   *dpu.Engine // nil without an agent or host-side prefetcher
	Leap     *dpu.Leap   // nil unless Prefetch is "leap"
	Link     *dpu.Link   // nil unless DPU is "shm:NAME"
	// Replicated is the Remote of replicated volumes (Replicas > 0);
	// Client is then nil.
	Replicated *replica.Remote
	group      *replica.Group                  // the filesystem's volumes, over Replicated
	dialNode   func(id string) *memnode.Client // with Replicated: a node's client (nil: unreachable)
	etcd       *clientv3.Client                // with Replicated
	Zone       *loadingzone.Zone
	HostView   *hostview.Set
	FS         *fs.FS
	Mounted    *fs.Mounted // nil unless Mount was set
	// Tracker follows the mount's kernel page cache into KernelView (the
	// agent's second Host View); nil when off, TrackerErr says why.
	Tracker    *pagecache.Tracker
	KernelView *pagecache.View
	TrackerErr error

	// busy counts the requests the front ends serve: the memory-node
	// clients' readers wait in poll(2) only while it is lone (sockio).
	busy *sockio.Busy
	// procs runs the process with cfg.LoneProcs Ps through runs of lone
	// hits (nil: no governor).
	procs *procgov.Governor

	closeOnce    sync.Once
	done         chan error
	nbdDone      chan error
	closers      []func() error
	leases       []volumeLease
	stopLeases   func()
	closeControl func() error // the etcd session and client, if any
	// With the control plane: the session the filesystem is held under,
	// the epochs volume its token comes from, its hold's release, and the
	// filesystem to fence if the session is lost (set once it is open).
	control  *cluster.Host
	ttl      time.Duration
	epochs   uint16
	fsHold   func(context.Context) error
	heldFS   atomic.Pointer[fs.FS]
	captures []func() // packet mirrors, stopped before the agent
	lat      *latencies
}

// Start connects to the memory node, opens the volumes and serves.
// When a step fails it undoes every step before it: no goroutine,
// listener, mapping or connection outlives the error.
func Start(ctx context.Context, cfg Config) (_ *Host, err error) {
	cfg.Log = cmp.Or(cfg.Log, slog.Default())
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	if cfg.Local {
		return startLocal(ctx, cfg)
	}
	if cfg.Replicas > 0 {
		return startReplicated(ctx, cfg)
	}
	busy := new(sockio.Busy)
	copt := memnode.ClientOptions{Token: cfg.Token, OpTimeout: cfg.OpTimeout, Stages: cfg.Stages, Busy: busy}
	if copt.TLS, err = memnodeTLS(cfg.MemnodeTLS); err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	c, err := memnode.Dial(ctx, cfg.Memnode, copt)
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	h := &Host{Client: c, busy: busy, done: make(chan error, 1)}
	h.onClose(c.Close)
	defer func() {
		if err != nil {
			h.Close(context.WithoutCancel(ctx))
		}
	}()
	// A write-back that cannot reach the node is retried for one operation
	// timeout before clients see EIO: a node restart inside it is invisible.
	opt := pagestore.Options{CacheBytes: cfg.CacheBytes, Policy: cfg.Policy, RetryFor: cfg.OpTimeout, Log: cfg.Log}
	remote, err := h.missPath(cfg, &opt, dpu.NodeConn{Client: c}, memnode.Remote{C: c})
	if err != nil {
		return nil, err
	}
	st, err := pagestore.New(remote, opt)
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	h.useStore(ctx, cfg, st)
	for _, vs := range cfg.Volumes {
		v, err := c.OpenOrCreate(ctx, vs.Name, vs.Size)
		if err != nil {
			return nil, fmt.Errorf("host: volume %q: %w", vs.Name, err)
		}
		if v.Size != (vs.Size+pageid.Size-1)&^(pageid.Size-1) {
			cfg.Log.Warn(fmt.Sprintf("volume %s exists at the memory node with size %s, not %s: serving the node's size", v.Name, units.FormatSize(v.Size), units.FormatSize(vs.Size)))
		}
		h.Volumes = append(h.Volumes, v)
	}
	if err := h.leaseVolumes(ctx, cfg); err != nil {
		return nil, err
	}
	for _, v := range h.Volumes {
		st.AddVolume(v)
	}
	if err := h.serve(ctx, cfg); err != nil {
		return nil, err
	}
	if cfg.Mount != "" {
		if err := h.mount(ctx, cfg); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// useStore makes st the host's page store: the volumes' holds are given
// up after its dirty pages are written back and after the background
// write-back (started here when configured) stops (closers run last
// first), so the next holder reads every page; on a failed start, those
// taken.
func (h *Host) useStore(ctx context.Context, cfg Config, st *pagestore.Store) {
	// What the host cache holds: the embedded agent counts its Host
	// View's false negatives against it; a split agent gets the list when
	// it attaches.
	if h.Agent != nil {
		h.Agent.Resident = st.Resident
		h.Agent.VolumePages = st.Pages
		if cfg.NBDListen != "" {
			h.Agent.StreamPages = int(cfg.NBDStreamFrom / pageid.Size)
		}
	}
	if h.Link != nil {
		h.Link.SetResident(st.EachResident)
	}
	h.onClose(h.releaseVolumes)
	if cfg.Writeback > 0 {
		wctx, cancel := context.WithCancel(ctx)
		wait := st.StartWriteback(wctx, cfg.Writeback)
		h.onClose(func() error { cancel(); wait(); return nil })
	}
	h.Store = st
}

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
	h.closeControl = cli.Close
	ch, err := cluster.NewHost(ctx, cli, cfg.Cluster, ttl)
	if err != nil {
		return fmt.Errorf("host: %w", err)
	}
	h.closeControl = func() error { return errors.Join(ch.Close(), cli.Close()) }
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
	for _, v := range h.Volumes {
		// Twice the TTL: an etcd that restarted (pd3 up --persist after a
		// crash) gives the dead holder's session a whole TTL again.
		hold, err := ch.Hold(ctx, v.Name, 2*ttl+time.Second)
		if err != nil {
			return fmt.Errorf("host: volume %q is served by another host: %w", v.Name, err)
		}
		h.leases = append(h.leases, volumeLease{v: v, release: hold.Release})
		if err := recordVolume(ctx, cli, cfg, v); err != nil {
			return err
		}
		if err := h.presentToken(ctx, v, epochs, hold); err != nil {
			return err
		}
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
func recordVolume(ctx context.Context, cli *clientv3.Client, cfg Config, v pageid.VolumeInfo) error {
	rec := cluster.VolumeRecord{Name: v.Name, ID: v.ID, Size: v.Size, PageSize: pageid.Size, NodeAddr: cfg.Memnode}
	if nodes, err := cluster.Nodes(ctx, cli, cfg.Cluster); err == nil {
		for _, n := range nodes {
			if n.Addr == cfg.Memnode {
				rec.Node = n.ID
			}
		}
	}
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	for _, vl := range h.leases {
		if h.Store != nil && h.Store.Fenced(vl.v.ID) {
			continue
		}
		errs = append(errs, vl.release(ctx))
	}
	h.leases = nil
	if h.fsHold != nil {
		if f := h.heldFS.Load(); f == nil || !f.Fenced() {
			errs = append(errs, h.fsHold(ctx))
		}
		h.fsHold = nil
	}
	if h.closeControl != nil {
		errs = append(errs, h.closeControl())
		h.closeControl = nil
	}
	return errors.Join(errs...)
}

// mount opens the filesystem and mounts it; the directory is created if
// missing.
func (h *Host) mount(ctx context.Context, cfg Config) error {
	if err := fs.Available(); err != nil {
		return fmt.Errorf("host: --mount %s: %w", cfg.Mount, err)
	}
	stale, err := fs.PrepareMountPoint(cfg.Mount)
	if err != nil {
		return fmt.Errorf("host: --mount %s: %w", cfg.Mount, err)
	}
	if stale {
		cfg.Log.Warn(fmt.Sprintf("detached a dead pd3 mount at %s, left by a pd3 that ended without unmounting", cfg.Mount))
	}
	fcfg := fs.Config{Name: cfg.FSName, Store: h.Store, Volumes: h.Volumes, LeaseTTL: cfg.FSLease, Log: cfg.Log, Busy: h.busy, Procs: h.procs}
	if h.Client != nil {
		fcfg.Backend = h.Client
	}
	// The FUSE request mirror and the tracker's events go to the agent:
	// in this process, or as messages to an agent process.
	var readAhead func(src int, first pageid.Key, n int, end uint64)
	switch {
	case h.Agent != nil:
		readAhead, fcfg.OnWrite = h.Agent.ReadAhead, h.Agent.Written
	case h.Link != nil:
		readAhead, fcfg.OnWrite = h.Link.ReadAhead, h.Link.Written
	}
	if readAhead != nil {
		fcfg.OnRead = func(first pageid.Key, n int, end uint64) { readAhead(dpu.SourceFUSE, first, n, end) }
	}
	if h.control != nil {
		if err := h.holdFS(ctx, cfg, &fcfg); err != nil {
			return err
		}
	}
	if h.Replicated != nil {
		g, err := h.openGroup(ctx, cfg)
		if err != nil {
			return fmt.Errorf("host: fs %q: %w", cfg.FSName, err)
		}
		h.group, fcfg.Backend = g, g
	}
	f, err := fs.Open(ctx, fcfg)
	if err != nil {
		return fmt.Errorf("host: %w", err)
	}
	if h.control != nil {
		h.heldFS.Store(f)
		select {
		case <-h.control.Lost(): // lost while opening: the watcher may have looked already
			f.Fence()
		default:
		}
	}
	m, err := fs.Mount(f, cfg.Mount)
	if err != nil {
		f.Close(ctx)
		return fmt.Errorf("host: %w", err)
	}
	h.FS, h.Mounted = f, m
	if readAhead == nil {
		h.TrackerErr = errors.New("no DPU agent to feed")
		return nil
	}
	// A file the mount reads ahead itself (fs: stream read-ahead) is not
	// the agent's to prefetch: it would fetch every page twice, and copy
	// it into the Loading Zone for nothing.
	view := &pagecache.View{KeyOf: f.KeyOf, OnRead: func(first pageid.Key, n int) {
		if !f.ReadingAhead(first) {
			readAhead(dpu.SourceKernel, first, n, f.EndOf(first))
		}
	}}
	var kv *hostview.Set
	if h.Agent != nil {
		pages := cfg.KernelViewPages
		if pages <= 0 {
			pages = 1 << 20
		}
		kv = hostview.New(pages, 2)
		view.Set = kv
	} else {
		view.OnRange = h.Link.KernelRange
	}
	tr, err := pagecache.Start(m.Dev, view)
	if err != nil {
		h.TrackerErr = err
		return nil
	}
	if kv != nil {
		h.Agent.SetKernelView(kv)
	}
	h.Tracker, h.KernelView = tr, view
	return nil
}

func startLocal(ctx context.Context, cfg Config) (*Host, error) {
	var total uint64
	for _, vs := range cfg.Volumes {
		total += (vs.Size + pageid.Size - 1) &^ (pageid.Size - 1)
	}
	st, err := pagestore.New(pagestore.NewMemRemote(), pagestore.Options{CacheBytes: int64(total) + 16*pageid.Size, Policy: cfg.Policy})
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	h := &Host{Store: st, busy: new(sockio.Busy), done: make(chan error, 1)}
	for i, vs := range cfg.Volumes {
		v := pageid.VolumeInfo{ID: uint16(i + 1), Name: vs.Name, Size: (vs.Size + pageid.Size - 1) &^ (pageid.Size - 1)}
		st.AddVolume(v)
		h.Volumes = append(h.Volumes, v)
	}
	if err := fillVolumes(ctx, st, h.Volumes); err != nil {
		return nil, fmt.Errorf("host: filling the local volumes: %w", err)
	}
	if err := h.serve(ctx, cfg); err != nil {
		h.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return h, nil
}

// fillVolumes writes the benchmarks' pattern (workload.FillPage) into
// every page of vols, so their readers can check each page they get.
func fillVolumes(ctx context.Context, st *pagestore.Store, vols []pageid.VolumeInfo) error {
	p := make([]byte, pageid.Size)
	for _, v := range vols {
		for pg := range v.Size / pageid.Size {
			k := pageid.MakeKey(v.ID, pg)
			workload.FillPage(k, p)
			if err := st.Put(ctx, k, p); err != nil {
				return err
			}
		}
	}
	return nil
}

func (h *Host) serve(ctx context.Context, cfg Config) error {
	h.lat = newLatencies()
	if h.procs = procgov.New(cfg.LoneProcs); h.procs != nil {
		h.onClose(func() error { h.procs.Other(); return nil }) // every P back
	}
	var mir, nbdMir mirror.Mirror
	switch {
	case h.Agent != nil:
		mir = h.Agent
		nbdMir = h.Agent.Mirror(func() dpu.Parser { return &dpu.NBDParser{Resolve: h.resolveExport} })
	case h.Link != nil:
		mir = h.Link
		nbdMir = h.Link.Mirror(dpu.ProtoNBD)
	}
	// tapped returns the mirror a frontend taps its reads into, after
	// starting a packet capture of its address instead when asked to.
	tapped := func(m mirror.Mirror, addr string) (mirror.Mirror, error) {
		switch cfg.Mirror {
		case MirrorTap:
			return m, nil
		case MirrorNone:
			return nil, nil
		}
		if h.Agent == nil { // split: the agent process captures
			return nil, nil
		}
		c, err := packet.ListenAddr(addr, m)
		if err != nil {
			return nil, err
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := c.Run(ctx); err != nil {
				cfg.Log.Warn("packet mirror stopped", "addr", addr, "err", err)
			}
		}()
		h.captures = append(h.captures, func() { c.Close(); <-done })
		return nil, nil
	}
	if cfg.NBDListen != "" {
		tlsCfg, err := NBDTLSConfig(cfg.NBDTLS, cfg.NBDTLSCertificates, cfg.RequireClientCert)
		if err != nil {
			return fmt.Errorf("host: NBD server: %w", err)
		}
		ln, err := Listen(cfg.NBDListen)
		if err != nil {
			return fmt.Errorf("host: NBD server: %w", err)
		}
		h.NBDAddr = addrString(ln)
		if nbdMir, err = tapped(nbdMir, h.NBDAddr); err != nil {
			ln.Close()
			return fmt.Errorf("host: NBD server: %w", err)
		}
		h.NBD = &nbd.Server{Backend: h.Store, Log: cfg.Log, Mirror: nbdMir, Stages: cfg.Stages, Latency: h.lat.observeNBD,
			TLS: tlsCfg, TLSRequired: cfg.NBDTLS == TLSRequire, PollFor: cfg.NBDPollFor, StreamFrom: cfg.NBDStreamFrom, Busy: h.busy, Procs: h.procs}

		for _, v := range h.Volumes {
			h.NBD.Exports = append(h.NBD.Exports, nbd.Export{
				Name: v.Name, Volume: v.ID, Size: v.Size, ReadOnly: slices.Contains(cfg.NBDReadOnly, v.Name),
				Description: fmt.Sprintf("pd3 volume %s (%s)", v.Name, units.FormatSize(v.Size)),
			})
		}
		h.nbdDone = make(chan error, 1)
		go func() { h.nbdDone <- h.NBD.Serve(ctx, ln) }()
	}
	if cfg.PageListen == "" {
		return nil
	}
	ln, err := Listen(cfg.PageListen)
	if err != nil {
		return fmt.Errorf("host: page server: %w", err)
	}
	h.PageAddr = addrString(ln)
	if mir, err = tapped(mir, h.PageAddr); err != nil {
		ln.Close()
		return fmt.Errorf("host: page server: %w", err)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	h.Page = &pageproto.Server{Backend: h.Store, Workers: cfg.Workers, Log: cfg.Log, Mirror: mir, Latency: h.lat.observePage, Busy: h.busy, Procs: h.procs}
	go func() { h.done <- h.Page.Serve(ctx, ln) }()
	return nil
}

// onClose registers f to run at Close, after the write-back; what is
// registered later runs earlier, so each step is undone before the steps
// it depends on.
func (h *Host) onClose(f func() error) { h.closers = append(h.closers, f) }

// Close stops the frontends, writes dirty pages back and disconnects. It
// also undoes a Start that failed part way: whatever was not started
// is skipped.
func (h *Host) Close(ctx context.Context) error {
	var err error
	h.closeOnce.Do(func() {
		for _, stop := range h.captures {
			stop()
		}
		if h.Tracker != nil {
			h.Tracker.Close()
		}
		var umountErr error
		if h.Mounted != nil {
			umountErr = h.Mounted.Unmount(ctx)
		}
		var serveErr, flushErr error
		if h.Page != nil {
			h.Page.Close()
			serveErr = closedByUs(<-h.done)
		}
		if h.NBD != nil {
			h.NBD.Close()
			<-h.nbdDone
		}
		if h.Store != nil {
			if flushErr = h.Store.Flush(ctx); flushErr != nil {
				flushErr = fmt.Errorf("host: writing back dirty pages: %w", flushErr)
			}
		}
		h.stopAgent()
		errs := []error{umountErr, serveErr, flushErr}
		for _, c := range slices.Backward(h.closers) {
			errs = append(errs, c())
		}
		err = errors.Join(errs...)
	})
	return err
}

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
		h.Agent = dpu.NewAgent(h.HostView, h.Zone, h.Engine, func() dpu.Parser { return new(dpu.PageParser) })
		opt.OnEvict = h.Agent.Evicted
		remote = h.Engine
	case AgentSplit:
		// A separate agent process: the host keeps its direct memnode
		// connection for whenever the agent is absent or dead.
		h.Link = dpu.OpenLink(cfg.DPU.Region, direct)
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

// resolveExport maps an NBD export name to its volume ("" = the first).
func (h *Host) resolveExport(name string) (uint16, bool) {
	if name == "" && len(h.Volumes) > 0 {
		return h.Volumes[0].ID, true
	}
	for _, v := range h.Volumes {
		if v.Name == name {
			return v.ID, true
		}
	}
	return 0, false
}

func (h *Host) stopAgent() {
	if h.Agent != nil {
		h.Agent.Close()
	}
	if h.Engine != nil {
		h.Engine.Close()
	}
}

// memnodeTLS loads the client end of the memory-node link; nil when f
// names no file.
func memnodeTLS(f tlsfiles.Files) (*tls.Config, error) {
	if !f.Enabled() {
		return nil, nil
	}
	cfg, err := f.Client()
	if err != nil {
		return nil, fmt.Errorf("memory-node link: %w", err)
	}
	return cfg, nil
}

// NBDTLSConfig loads the NBD server's TLS configuration for mode from
// dir, laid out as nbdkit's --tls-certificates: server-cert.pem,
// server-key.pem and, to verify client certificates, ca-cert.pem. nil for
// TLSOff.
func NBDTLSConfig(mode TLSMode, dir string, requireClientCert bool) (*tls.Config, error) {
	if mode == TLSOff {
		return nil, nil
	}
	if dir == "" {
		return nil, fmt.Errorf("TLS %s needs a certificate directory (server-cert.pem, server-key.pem, ca-cert.pem)", mode)
	}
	f := tlsfiles.Files{Cert: filepath.Join(dir, tlsfiles.ServerCert), Key: filepath.Join(dir, tlsfiles.ServerKey)}
	ca := filepath.Join(dir, tlsfiles.CACert)
	switch _, err := os.Stat(ca); {
	case err == nil:
		f.CA = ca
	case requireClientCert:
		return nil, fmt.Errorf("verifying client certificates needs %s: %w", ca, err)
	}
	cfg, err := f.Server()
	if err != nil {
		return nil, fmt.Errorf("TLS certificates in %s: %w", dir, err)
	}
	if f.CA != "" && !requireClientCert {
		// nbdkit's default: a client certificate is checked if given.
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return cfg, nil
}
