package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/host"
	"github.com/pd3-go/pd3/internal/clilog"
	"github.com/pd3-go/pd3/internal/stages"
	"github.com/pd3-go/pd3/internal/tlsfiles"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"
)

type hostFlags struct {
	volumes   []host.VolumeSpec
	page      string
	cache     uint64
	policy    string
	memnode   string
	token     *secretFlag
	nodeTLS   tlsfiles.Files
	etcd      *etcdFlags
	workers   int
	opTimeout time.Duration
	local     bool
	shadow    bool
	dpu       host.AgentMode
	lz        uint64
	metrics   string
	prefetch  host.Prefetcher
	mirror    host.Mirror
	nbd       string
	nbdRO     []string
	nbdPoll   time.Duration
	nbdStream uint64
	loneProcs int
	tls       host.TLSMode
	tlsCerts  string
	tlsVerify bool
	writeback time.Duration
	mount     string
	fsName    string
	fsLease   time.Duration
	volLease  time.Duration
	replicas  int
	ec        cluster.Scheme
	repair    uint64
}

func (f *hostFlags) add(cmd *cobra.Command, memnodeHelp string) {
	fl := cmd.Flags()
	volumesVar(fl, &f.volumes, "volume", []host.VolumeSpec{{Name: "disk0", Size: 1 << 30}}, "a volume to serve (repeatable); created at the node when missing")
	fl.StringVar(&f.page, "page", "127.0.0.1:7000", "page-protocol listen address (host:port or unix:/path; empty disables)")
	fl.StringVar(&f.nbd, "nbd", "127.0.0.1:10809", "NBD listen address; every volume is an export (empty disables)")
	fl.StringArrayVar(&f.nbdRO, "nbd-readonly", nil, "export volume NAME read-only over NBD (repeatable)")
	fl.IntVar(&f.loneProcs, "lone-procs", 1, "OS threads running Go code while the host answers reads from its cache one at a time: after a run of such reads it drops to this many, and back to all at the next request of any other kind (0: never change; on two shared cores one thread made a cached NBD read at queue depth 1 2.5x faster at the median, docs/decisions.md, 23)")
	fl.DurationVar(&f.nbdPoll, "nbd-poll-for", 0, "after answering a read from the cache, an NBD connection polls this long for the next request before it sleeps (e.g. 50µs: faster reads at queue depth 1 when pages are cached, for a core's worth of polling; 0: sleep at once)")
	pagesVar(fl, &f.nbdStream, "nbd-stream-from", "64KiB", "NBD reads of at least this size are served without caching their pages (the client's page cache holds them now, and a scan would evict what it lacks); 0 caches every read")
	fl.Var(&f.tls, "tls", "NBD over TLS: off, on (STARTTLS offered) or require (nothing in clear; clients use nbds:// URIs)")
	fl.StringVar(&f.tlsCerts, "tls-certificates", "", "directory with server-cert.pem, server-key.pem and (to verify clients) ca-cert.pem, as nbdkit's")
	fl.BoolVar(&f.tlsVerify, "tls-verify-peer", false, "NBD clients must present a certificate signed by ca-cert.pem")
	pagesVar(fl, &f.cache, "cache", "64MiB", "host page-cache capacity")
	fl.StringVar(&f.policy, "policy", "s3fifo", "cache eviction policy: s3fifo or clock")
	fl.StringVar(&f.memnode, "memnode", "", memnodeHelp)
	f.token = tokenFlag(fl, "memory-node access token (default $PD3_TOKEN)")
	tlsFilesVar(fl, &f.nodeTLS, "memnode-", false)
	f.etcd = addEtcdFlags(fl, "the control plane: etcd client URLs (comma-separated); each volume is held there, one host at a time (pd3 up: its embedded etcd unless given; without one, leases at the memory node)")
	fl.IntVar(&f.workers, "workers", 0, "page-server worker threads (default: GOMAXPROCS, see --procs)")
	fl.DurationVar(&f.opTimeout, "op-timeout", 30*time.Second, "fail memory-node requests after this long without an answer")
	fl.DurationVar(&f.writeback, "writeback", time.Second, "write dirty pages back this often without waiting for FLUSH, retrying after outages (0 disables)")
	f.dpu = host.EmbeddedAgent
	fl.Var(&f.dpu, "dpu", "DPU agent: embedded (goroutines in this process), shm:NAME (a pd3 dpu process) or none (direct memory-node reads)")
	pagesVar(fl, &f.lz, "lz", "16MiB", "Loading Zone size (with an agent or host-side prefetcher)")
	fl.Var(&f.prefetch, "prefetch", "host-side prefetcher with --dpu none: none or leap")
	fl.Var(&f.mirror, "mirror", "how the agent sees requests: tap (connection readers hand it their bytes), packet (AF_PACKET capture of the ports; with --dpu shm:NAME the agent captures: pd3 dpu --packet) or none")
	fl.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics on ADDR (e.g. 127.0.0.1:9100)")
	fl.StringVar(&f.mount, "mount", "", "mount the FUSE filesystem at DIR (created if missing; empty disables)")
	fl.StringVar(&f.fsName, "fs-name", "pd3", "filesystem name: one memory node can hold several")
	fl.DurationVar(&f.fsLease, "fs-lease", 5*time.Second, "mount lease at the memory node: a second host cannot mount the filesystem; after a crash the next mount waits this long at most")
	fl.DurationVar(&f.volLease, "volume-lease", 5*time.Second, "lease on each served volume at the memory node: a second host cannot serve it; after a crash the next host waits this long at most")
	fl.IntVar(&f.replicas, "replicas", 0, "stripe volumes over every memory node of the cluster (needs --etcd), each 16 MiB extent on this many nodes, surviving the loss of all but one; 0: volumes live on the one --memnode (pd3 up --memnodes N>1: default 2)")
	fl.Var(schemeValue{&f.ec}, "ec", "place new volumes erasure-coded over the cluster's memory nodes (needs --etcd): each group of K 16 MiB extents on K nodes with M parity extents on M more, surviving the loss of any M of them for (K+M)/K of the memory (e.g. 4+2: two losses for 1.5x); existing volumes are served as the control plane records them; the --mount filesystem stays replicated (--replicas, default M+1)")
	pagesVar(fl, &f.repair, "repair-rate", "256MiB", "with --replicas: copy at most this much a second to restore the replicas a lost node held")
	fl.BoolVar(&f.local, "local", false, "keep volumes in host memory instead of a memory node (benchmark baseline)")
	fl.MarkHidden("local")
	fl.BoolVar(&f.shadow, "shadow-reads", false, "every read also fetches its pages from the memory nodes and drops them, unwaited (with a cache as large as the data: a perfect prefetcher's cost, the benchmarks' oracle)")
	fl.MarkHidden("shadow-reads")
}

func (f *hostFlags) config(log *slog.Logger) (host.Config, error) {
	etcd, err := f.etcd.access()
	if err != nil {
		return host.Config{}, err
	}
	cfg := host.Config{
		Memnode: f.memnode, Token: f.token.Value(), MemnodeTLS: f.nodeTLS, Etcd: etcd, Cluster: f.etcd.cluster, Policy: f.policy, PageListen: f.page,
		Workers: f.workers, OpTimeout: f.opTimeout, Log: log, Local: f.local, DPU: f.dpu, Prefetch: f.prefetch, Mirror: f.mirror,
		NBDListen: f.nbd, NBDReadOnly: f.nbdRO, NBDPollFor: f.nbdPoll, NBDStreamFrom: uint32(min(f.nbdStream, 1<<31)), LoneProcs: f.loneProcs, Writeback: f.writeback,
		NBDTLS: f.tls, NBDTLSCertificates: f.tlsCerts, RequireClientCert: f.tlsVerify,
		Mount: f.mount, FSName: f.fsName, FSLease: f.fsLease, VolumeLease: f.volLease,
		Stages: stageRecorder(), Replicas: f.replicas, EC: f.ec, RepairRate: int64(f.repair), ShadowReads: f.shadow,
	}
	cfg.LZBytes, cfg.CacheBytes = int64(f.lz), int64(f.cache)
	cfg.Volumes = f.volumes
	return cfg, nil
}

// logger is the command's one log: start-up notices and the libraries'
// records alike, as "pd3: ..." lines on stderr (stdout is for data).
func logger() *slog.Logger { return clilog.New(os.Stderr, slog.LevelInfo) }

func upCmd() *cobra.Command {
	var f hostFlags
	var e embedFlags
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run memory node and host in one process",
		Long: `Run a memory node and a host in one process: every volume is served over the
page protocol. Stop with Ctrl-C (SIGINT) or SIGTERM; dirty pages are written
back to the memory node first.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.config(logger())
			if err != nil {
				return err
			}
			if err := fs.Available(); err != nil && !cmd.Flags().Changed("mount") {
				cfg.Log.Info(fmt.Sprintf("not mounting %s: %v", cfg.Mount, err))
				cfg.Mount = ""
			}
			if e.memnodes > 1 && cfg.Memnode != "" {
				return usageError{errors.New("--memnodes starts embedded memory nodes: it does not go with --memnode")}
			}
			if e.memnodes > 1 && !cmd.Flags().Changed("replicas") && cfg.EC.K == 0 {
				cfg.Replicas = 2
			}
			if cfg.Memnode == "" && !cfg.Local {
				if err := inFlagWords(e.config().Check(cfg)); err != nil {
					return err
				}
			}
			if err := checkFirst(cfg, true); err != nil {
				return err
			}
			if err := portsFree(f.ports(&e)); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runUp(ctx, cfg, e, f.metrics)
		},
	}
	f.add(cmd, "use the memory node at ADDR instead of an embedded one")
	setDefault(cmd, "mount", "./pd3-mnt", &f.mount)
	e.add(cmd.Flags(), "make the embedded memory node durable in DIR (acknowledged writes survive crashes)")
	return serving(cmd)
}

// embedFlags configure what pd3 up and pd3 mount start besides the host
// when no --memnode is given: a memory node and the control plane.
type embedFlags struct {
	listen, persist, etcdListen string
	memnodes                    int
}

func (e *embedFlags) add(fl *pflag.FlagSet, persistHelp string) {
	fl.StringVar(&e.listen, "memnode-listen", "127.0.0.1:0", "listen address of the embedded memory node")
	fl.StringVar(&e.persist, "persist", "", persistHelp)
	fl.IntVar(&e.memnodes, "memnodes", 1, "embedded memory nodes to start (more than one: volumes are replicated over them, --replicas)")
	fl.StringVar(&e.etcdListen, "etcd-listen", "127.0.0.1:0", "client address of the embedded etcd, started unless --etcd names one (data in --persist DIR/etcd, else a temporary directory); none runs without a control plane")
}

// ports are the listen addresses the host's flags ask for, and the
// embedded cluster's (e, when it is started), by flag.
func (f *hostFlags) ports(e *embedFlags) map[string]string {
	m := map[string]string{"--nbd": f.nbd, "--page": f.page, "--metrics": f.metrics}
	if e != nil && f.memnode == "" {
		m["--memnode-listen"] = e.listen
		if e.etcdListen != "none" {
			m["--etcd-listen"] = e.etcdListen
		}
	}
	return m
}

// config is the embedded cluster the flags ask for.
func (e *embedFlags) config() host.EmbeddedConfig {
	return host.EmbeddedConfig{Memnodes: e.memnodes, MemnodeListen: e.listen, Persist: e.persist, EtcdListen: e.etcdListen}
}

func setDefault(cmd *cobra.Command, flag, value string, p *string) {
	cmd.Flags().Lookup(flag).DefValue = value
	*p = value
}

// runUp runs an embedded memory node (unless cfg names one), registered
// with the control plane (an embedded etcd unless e names one), and a host.
func runUp(ctx context.Context, cfg host.Config, e embedFlags, metrics string) error {
	log := cfg.Log
	if cfg.Memnode == "" && !cfg.Local {
		ec := e.config()
		ec.Progress, ec.Log = recoveryProgress(os.Stderr, term.IsTerminal(int(os.Stderr.Fd()))), log
		emb, err := host.StartEmbedded(ctx, &cfg, ec)
		if err != nil {
			return inFlagWords(err)
		}
		defer emb.Close()
		if emb.Etcd != nil {
			log.Info(fmt.Sprintf("etcd listening on %s (embedded; try: %s cluster status --etcd %s)", emb.Etcd.Endpoint, os.Args[0], emb.Etcd.Endpoint))
		}
		for _, node := range emb.Nodes {
			log.Info(fmt.Sprintf("memory node listening on %s (embedded)", node.Addr))
		}
	}
	return runHost(ctx, cfg, metrics)
}

func mountCmd() *cobra.Command {
	var f hostFlags
	var e embedFlags
	cmd := &cobra.Command{
		Use:   "mount DIR",
		Short: "Mount the remote-memory filesystem at DIR",
		Long: `Mount pd3's FUSE filesystem at DIR: files whose bytes live at the memory
node, cached by the host's page store. Without --memnode an embedded memory
node is started (volatile unless --persist). Stop with Ctrl-C or SIGTERM: the
filesystem is unmounted and everything written back. NBD volumes appear as
DIR/volumes/NAME.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f.mount = args[0]
			cfg, err := f.config(logger())
			if err != nil {
				return err
			}
			if err := fs.Available(); err != nil {
				return err
			}
			if err := checkFirst(cfg, true); err != nil {
				return err
			}
			if err := portsFree(f.ports(&e)); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runUp(ctx, cfg, e, f.metrics)
		},
	}
	f.add(cmd, "memory node address (default: an embedded one)")
	cmd.Flags().MarkHidden("mount")
	setDefault(cmd, "page", "", &f.page)
	setDefault(cmd, "nbd", "", &f.nbd)
	e.add(cmd.Flags(), "make the embedded memory node durable in DIR")
	return serving(cmd)
}

func serveCmd() *cobra.Command {
	var f hostFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a host against a separate memory node",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := f.config(logger())
			if err != nil {
				return err
			}
			if cfg.Replicas > 0 || cfg.EC.K > 0 {
				if !cfg.Etcd.Enabled() {
					flag := "--replicas"
					if cfg.EC.K > 0 {
						flag = "--ec"
					}
					return usageError{fmt.Errorf("%s places volumes through the control plane: give --etcd URLS", flag)}
				}
			} else if cfg.Memnode == "" && !cfg.Local {
				if !cfg.Etcd.Enabled() {
					return usageError{errors.New("--memnode ADDR or --etcd URLS is required: a memory node to serve from, or the control plane to place volumes over its nodes (start a node with: pd3 memnode --listen 127.0.0.1:7100)")}
				}
				cfg.Log.Info("no --memnode: the control plane places the volumes over its memory nodes (one copy of each 16 MiB extent; --replicas N for more)")
			}
			if err := checkFirst(cfg, false); err != nil {
				return err
			}
			if err := portsFree(f.ports(nil)); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runHost(ctx, cfg, f.metrics)
		},
	}
	f.add(cmd, "memory node address (host:port or unix:/path); without it, --etcd places the volumes over the cluster's nodes")
	return serving(cmd)
}

func runHost(ctx context.Context, cfg host.Config, metrics string) error {
	log := cfg.Log
	h, err := host.Start(ctx, cfg)
	if err != nil {
		return err
	}
	if metrics != "" {
		addr, err := h.ServeMetrics(ctx, metrics)
		if err != nil {
			h.Close(ctx)
			return err
		}
		log.Info(fmt.Sprintf("metrics listening on http://%s/metrics", addr))
	}
	for _, v := range h.Volumes {
		log.Info(fmt.Sprintf("volume %s id %d size %s", v.Name, v.ID, units.FormatSize(v.Size)))
	}
	switch {
	case h.Agent != nil:
		log.Info(fmt.Sprintf("DPU agent embedded (Loading Zone %d pages, mirror %s)", h.Zone.Records(), cfg.Mirror))
	case h.Link != nil:
		state := "attached"
		if !h.Link.Attached() {
			state = "not running yet: serving directly until it starts"
		}
		log.Info(fmt.Sprintf("DPU agent process %s: %s", cfg.DPU, state))
	case h.Leap != nil:
		log.Info(fmt.Sprintf("no DPU agent; Leap prefetches on the host (Loading Zone %d pages)", h.Zone.Records()))
	}
	if h.NBDAddr != "" {
		var names []string
		for _, e := range h.NBD.Exports {
			if e.ReadOnly {
				names = append(names, e.Name+" (read-only)")
			} else {
				names = append(names, e.Name)
			}
		}
		log.Info(fmt.Sprintf("NBD server listening on %s (exports: %s)", h.NBDAddr, strings.Join(names, ", ")))
		uri := host.NBDURI(h.NBDAddr, h.Volumes[0].Name)
		if cfg.NBDTLS != host.TLSOff {
			// TLS: the nbds schemes, and a directory holding the CA (and
			// a client certificate when the server asks for one).
			sep := "?"
			if strings.Contains(uri, "?") {
				sep = "&"
			}
			uri = "nbds" + strings.TrimPrefix(uri, "nbd") + sep + "tls-certificates=CLIENT-DIR"
		}
		log.Info(fmt.Sprintf("try: nbdinfo '%s'", uri))
	}
	if h.Mounted != nil {
		log.Info(fmt.Sprintf("filesystem %q mounted at %s (NBD volumes under %s/volumes)", cfg.FSName, h.Mounted.Dir, h.Mounted.Dir))
		if h.Tracker != nil {
			log.Info("page-cache tracker on: the agent skips pages the kernel caches of files of 1MiB or more")
		} else {
			log.Info(fmt.Sprintf("page-cache tracker off: %v", h.TrackerErr))
		}
	}
	if h.PageAddr != "" {
		log.Info(fmt.Sprintf("page server listening on %s (cache %s, workers %d)", h.PageAddr, units.FormatSize(uint64(cfg.CacheBytes)), h.Page.Workers))
		// Suggest the binary as it was invoked: after `make run` it is
		// ./bin/pd3, not on PATH.
		self := os.Args[0]
		log.Info(fmt.Sprintf("try: echo hello | %s page put --page %s %d:0 && %s page get --page %s %d:0 | head -c 6",
			self, h.PageAddr, h.Volumes[0].ID, self, h.PageAddr, h.Volumes[0].ID))
	}
	stopping := notifyReady(ctx, log, fmt.Sprintf("serving %d volumes", len(h.Volumes)))
	<-ctx.Done()
	stopping()
	st := h.Store.Stats()
	if st.DirtyPages == 0 {
		log.Info("stopping: no dirty pages to write back")
	} else {
		log.Info(fmt.Sprintf("stopping: writing back %d dirty pages (%s) to the memory node", st.DirtyPages, units.FormatSize(uint64(st.DirtyPages)*pageid.Size)))
	}
	if h.Agent != nil {
		log.Info(fmt.Sprintf("agent: parsed %d, prefetched %d (placed %d, consumed %d, dropped unconsumed %d, stale %d), skipped as cached %d",
			h.Agent.Parsed.Load(), h.Engine.Issued.Load(), h.Engine.Placed.Load(), h.Zone.Hits.Load(),
			h.Zone.DroppedUnconsumed.Load(), h.Engine.Stale.Load(), h.Agent.Skipped.Load()))
	}
	cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stopBar := writebackProgress(os.Stderr, term.IsTerminal(int(os.Stderr.Fd())), h.Store, st.DirtyPages)
	err = h.Close(cctx)
	stopBar()
	if err != nil {
		return err
	}
	if h.Mounted != nil {
		log.Info(fmt.Sprintf("filesystem unmounted from %s", h.Mounted.Dir))
	}
	if wrote := h.Store.Stats().WriteBacks - st.WriteBacks; wrote > 0 {
		log.Info(fmt.Sprintf("stopped: %d pages (%s) written back to the memory node while stopping", wrote, units.FormatSize(wrote*pageid.Size)))
	} else {
		log.Info("stopped")
	}
	return nil
}

func memnodeCmd() *cobra.Command {
	var listen, persist, metrics string
	var capBytes uint64
	var pollFor time.Duration
	var token *secretFlag
	var grants []string
	var tlsFiles tlsfiles.Files
	var etcd *etcdFlags
	cmd := &cobra.Command{
		Use:   "memnode",
		Short: "Run a memory node alone",
		Long: `Run a memory node. Without --persist its memory is volatile: stopping it
loses every volume, as powering off RAM would. With --persist DIR every write
is logged and acknowledged only once on stable storage (fdatasync, group
commit), so acknowledged writes survive a crash or power loss.

--token reaches every volume; each --grant TOKEN=PATTERN[,PATTERN...] adds a
token that reaches only the volumes whose names match a pattern (path.Match
syntax, e.g. tenant1.*), as if the rest did not exist. Every connection
reaches volumes through memory windows bound on that connection, so a
window key copied from one connection is refused on another.

--tls-cert and --tls-key make every connection TLS (hosts and agents give
--memnode-tls-ca); with --tls-ca too, clients must present a certificate
that CA signed (--memnode-tls-cert, --memnode-tls-key): mutual TLS.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			gs, err := parseGrants(grants)
			if err != nil {
				return err
			}
			log := logger()
			access, err := etcd.access()
			if err != nil {
				return err
			}
			node, err := host.StartMemnode(ctx, host.MemnodeConfig{Listen: listen, Token: token.Value(), TLS: tlsFiles, Grants: gs, Etcd: access, Cluster: etcd.cluster,
				Progress: recoveryProgress(os.Stderr, term.IsTerminal(int(os.Stderr.Fd()))), Capacity: capBytes, Log: log, Persist: persist, Stages: stageRecorder(),
				PollFor: cmp.Or(pollFor, -1), // the flag's 0: sleep at once
				Metrics: metrics})
			if err != nil {
				return err
			}
			mode := "volatile"
			if persist != "" {
				mode = "persistent in " + persist
			}
			switch {
			case tlsFiles.CA != "":
				mode += ", mutual TLS"
			case tlsFiles.Enabled():
				mode += ", TLS"
			}
			if node.ID != "" {
				mode += fmt.Sprintf(", node %s of cluster %s", node.ID, etcd.cluster)
			}
			log.Info(fmt.Sprintf("memory node listening on %s (%s)", node.Addr, mode))
			if node.MetricsAddr != "" {
				log.Info(fmt.Sprintf("metrics listening on http://%s/metrics", node.MetricsAddr))
			}
			stopping := notifyReady(ctx, log, "memory node listening on "+node.Addr)
			<-ctx.Done()
			stopping()
			vols, used := len(node.Server.Store.List()), node.Server.Store.Used()
			log.Info(fmt.Sprintf("memory node stopping: %s, %s of memory", units.Count(vols, "volume", ""), units.FormatSize(used)))
			if err := node.Close(); err != nil {
				return err
			}
			if persist != "" {
				log.Info("memory node stopped: its volumes are on disk in " + persist + "; start it again with the same --persist")
			} else {
				log.Info("memory node stopped: it was volatile, so its volumes are gone")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:7100", "listen address (host:port or unix:/path)")
	token = tokenFlag(cmd.Flags(), "access token clients must present (default $PD3_TOKEN; empty accepts all)")
	tlsFilesVar(cmd.Flags(), &tlsFiles, "", true)
	etcd = addEtcdFlags(cmd.Flags(), "register with the control plane: etcd client URLs (comma-separated); the node is up while it renews its lease")
	pagesVar(cmd.Flags(), &capBytes, "capacity", "0", "page memory limit (0 = unlimited)")
	cmd.Flags().DurationVar(&pollFor, "poll-for", memnode.DefaultPollFor, "how long a connection whose requests ran dry polls for the next one before it sleeps (0: sleep at once; a quiet connection polls once, then sleeps; while the node serves more than one connection none polls, docs/decisions.md 45)")
	cmd.Flags().StringVar(&persist, "persist", "", "directory that makes the node durable (log + page files)")
	cmd.Flags().StringVar(&metrics, "metrics", "", "serve Prometheus metrics on ADDR (e.g. 127.0.0.1:9101)")
	cmd.Flags().StringArrayVar(&grants, "grant", nil, "TOKEN=PATTERN[,PATTERN...]: a token that reaches only the volumes matching a pattern (repeatable; with grants, an empty --token accepts only their tokens)")
	return serving(cmd)
}

// parseGrants parses --grant values.
func parseGrants(specs []string) ([]memnode.Grant, error) {
	var out []memnode.Grant
	for _, s := range specs {
		tok, pats, ok := strings.Cut(s, "=")
		if !ok || tok == "" || pats == "" {
			return nil, fmt.Errorf("--grant %q: want TOKEN=PATTERN[,PATTERN...]", s)
		}
		g := memnode.Grant{Token: tok}
		for _, p := range strings.Split(pats, ",") {
			if _, err := path.Match(p, ""); err != nil || p == "" {
				return nil, fmt.Errorf("--grant %q: bad pattern %q", s, p)
			}
			g.Volumes = append(g.Volumes, p)
		}
		out = append(out, g)
	}
	return out, nil
}

// stageRecorder maps the stage recorder a breakdown benchmark names in
// $PD3_STAGES (pd3 bench nbd --breakdown); nil, recording nothing,
// otherwise.
func stageRecorder() *stages.Recorder {
	name := os.Getenv("PD3_STAGES")
	if name == "" {
		return nil
	}
	r, err := stages.Open(name)
	if err != nil {
		logger().Warn("no stage stamps", "err", err)
		return nil
	}
	return r
}

// writebackProgress draws the shutdown's write-back of dirty pages as a
// progress bar on w while a person watches it (tty), and returns the
// function that removes it once the write-back is over.
// bytesBar is a progress bar of total bytes on w, described as "what SIZE"
// and cleared when it finishes.
func bytesBar(w io.Writer, total int64, what string, more ...progressbar.Option) *progressbar.ProgressBar {
	opts := []progressbar.Option{progressbar.OptionSetWriter(w), progressbar.OptionShowBytes(true),
		progressbar.OptionSetWidth(30), progressbar.OptionClearOnFinish(),
		progressbar.OptionSetDescription(what + " " + units.FormatSize(uint64(total)))}
	return progressbar.NewOptions64(total, append(opts, more...)...)
}

// recoveryProgress draws the recovery of a --persist directory (page
// files and log read back at start) as a bar on w when it is a terminal;
// nil otherwise.
func recoveryProgress(w io.Writer, tty bool) memnode.Progress {
	if !tty {
		return nil
	}
	var bar *progressbar.ProgressBar
	return func(done, total int64) {
		if total == 0 {
			return
		}
		if bar == nil {
			bar = bytesBar(w, total, "recovering", progressbar.OptionThrottle(50*time.Millisecond))
		}
		bar.Set64(done)
		if done == total {
			bar.Finish()
		}
	}
}

func writebackProgress(w io.Writer, tty bool, st *pagestore.Store, dirty int) (stop func()) {
	if dirty == 0 || !tty {
		return func() {}
	}
	total := int64(dirty) * pageid.Size
	bar := bytesBar(w, total, "writing back")
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				bar.Finish()
				return
			case <-t.C:
				left := int64(st.Stats().DirtyPages) * pageid.Size
				bar.Set64(max(0, total-left))
			}
		}
	}()
	return func() { close(done); <-exited }
}
