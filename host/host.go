package host

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/dpu"
	"github.com/pd3-go/pd3/dpu/split"
	"github.com/pd3-go/pd3/ec"
	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/hostview"
	"github.com/pd3-go/pd3/hostview/pagecache"
	"github.com/pd3-go/pd3/internal/pipeline"
	"github.com/pd3-go/pd3/internal/procgov"
	"github.com/pd3-go/pd3/internal/sockio"
	"github.com/pd3-go/pd3/internal/stages"
	"github.com/pd3-go/pd3/internal/tlsfiles"
	"github.com/pd3-go/pd3/internal/units"
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
	// ShadowReads is for measurement (pd3 bench apps's oracle systems):
	// pagestore.Options.Shadow.
	ShadowReads bool
	PageListen  string // page-protocol address; "" = no page server
	NBDListen   string // NBD address; "" = no NBD server
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
	// Mount, if set, mounts the FUSE filesystem FSName (default
	// fs.DefaultName) there.
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
	// one node Memnode or, with no Memnode, are placed by the control
	// plane as with 1.
	Replicas int
	// EC, if set (with Etcd), places new volumes erasure-coded: each
	// group of K extents on K nodes with M parity extents on M more
	// (package ec). Volumes the control plane knows are served as their
	// records say. The filesystem of Mount stays replicated, with
	// Replicas copies (M+1 if Replicas is 0: it survives as many losses).
	EC cluster.Scheme
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
	Link     *split.Link // nil unless DPU is "shm:NAME"
	// Replicated is the Remote of replicated volumes (Replicas > 0);
	// Client is then nil.
	Replicated *replica.Remote
	// Coded is the Remote of erasure-coded volumes (nil: none served).
	Coded    *ec.Remote
	group    *replica.Group                  // the filesystem's volumes, over Replicated
	dialNode func(id string) *memnode.Client // with Replicated: a node's client (nil: unreachable)
	etcd     *clientv3.Client                // with Replicated
	Zone     *loadingzone.Zone
	HostView *hostview.Set
	FS       *fs.FS
	Mounted  *fs.Mounted // nil unless Mount was set
	// Tracker follows the mount's kernel page cache into KernelView (the
	// agent's second Host View); nil when off, TrackerErr says why.
	Tracker    *pagecache.Tracker
	KernelView *pagecache.View
	TrackerErr error

	// busy counts the requests the front ends serve: the memory-node
	// clients' readers wait in poll(2) only while it is lone (sockio).
	busy *sockio.Busy
	// cork is shared by the memory-node sessions and held by the NBD
	// server over a burst of requests (pipeline.Cork); nil for a host
	// without memory nodes.
	cork *pipeline.Cork
	// procs runs the process with cfg.LoneProcs Ps through runs of lone
	// hits (nil: no governor).
	procs *procgov.Governor

	closeOnce    sync.Once
	done         chan error
	nbdDone      chan error
	closers      []func() error
	leases       []volumeLease
	stopLeases   func()
	closeControl func(context.Context) error // the etcd session and client, if any
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
	cfg.FSName = cmp.Or(cfg.FSName, fs.DefaultName)
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	if cfg.Local {
		return startLocal(ctx, cfg)
	}
	if cfg.EC.K > 0 && cfg.Replicas == 0 {
		cfg.Replicas = cfg.EC.M + 1
	}
	if cfg.Replicas > 0 {
		return startReplicated(ctx, cfg)
	}
	if cfg.Memnode == "" {
		// The control plane places the volumes over its nodes, one copy
		// of each extent, and finds them again on a restart.
		cfg.Replicas = 1
		return startReplicated(ctx, cfg)
	}
	busy, cork := new(sockio.Busy), new(pipeline.Cork)
	copt := memnode.ClientOptions{Token: cfg.Token, OpTimeout: cfg.OpTimeout, Stages: cfg.Stages, Busy: busy, Cork: cork}
	if copt.TLS, err = memnodeTLS(cfg.MemnodeTLS); err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	c, err := memnode.Dial(ctx, cfg.Memnode, copt)
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	h := &Host{Client: c, busy: busy, cork: cork, done: make(chan error, 1)}
	h.onClose(c.Close)
	defer func() {
		if err != nil {
			h.Close(context.WithoutCancel(ctx))
		}
	}()
	st, err := h.openStore(ctx, cfg, dpu.NodeConn{Client: c}, memnode.Remote{C: c})
	if err != nil {
		return nil, err
	}
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

// openStore builds the host's page store over direct, behind the agent's
// or the prefetcher's miss path when cfg asks for one (conn is the
// engine's way to the nodes), and makes it the host's (useStore).
func (h *Host) openStore(ctx context.Context, cfg Config, conn dpu.Conn, direct pagestore.Remote) (*pagestore.Store, error) {
	// A write-back that cannot reach the node is retried for one operation
	// timeout before clients see EIO: a node restart inside it is invisible.
	opt := pagestore.Options{CacheBytes: cfg.CacheBytes, Policy: cfg.Policy, RetryFor: cfg.OpTimeout, Log: cfg.Log, Shadow: cfg.ShadowReads}
	remote, err := h.missPath(cfg, &opt, conn, direct)
	if err != nil {
		return nil, err
	}
	st, err := pagestore.New(remote, opt)
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	h.useStore(ctx, cfg, st)
	return st, nil
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
			h.Store.StopReadAhead()
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
