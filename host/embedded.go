package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/cluster/etcdembed"
	"github.com/pd3-go/pd3/memnode"
)

// EmbeddedConfig is what a one-process cluster (pd3 up, pd3 mount) starts
// beside its host when the host's Config names no memory node.
type EmbeddedConfig struct {
	// Memnodes is how many memory nodes to start (at least one); more than
	// one serve replicated volumes, so the host's Config.Replicas must be
	// set.
	Memnodes int
	// MemnodeListen is each node's listen address (default 127.0.0.1:0;
	// with several nodes, the port must be 0).
	MemnodeListen string
	// Persist, if set, makes the nodes durable in this directory (a
	// subdirectory memnode-I each when there are several) and keeps the
	// embedded etcd's data in Persist/etcd; otherwise etcd's data is in a
	// temporary directory removed at Close.
	Persist string
	// EtcdListen is the embedded etcd's client address (default
	// 127.0.0.1:0), started unless the host's Config names an etcd;
	// "none" starts none (the volumes are leased at the node).
	EtcdListen string
	// Progress, if set, is told how a durable node's recovery goes.
	Progress memnode.Progress
	Log      *slog.Logger
}

// Embedded is a running one-process cluster: an etcd (nil if the host's
// Config named one or EtcdListen was "none") and memory nodes registered
// with it.
type Embedded struct {
	Etcd  *etcdembed.Server
	Nodes []*Memnode

	closers []func() error
}

// Check refuses an EmbeddedConfig that cannot serve cfg, as a
// *ConfigError naming the field at fault (EmbeddedConfig.X or Config.X),
// before anything starts. StartEmbedded calls it; a command may call it
// sooner.
func (e EmbeddedConfig) Check(cfg Config) error {
	switch {
	case cfg.Memnode != "" || cfg.Local:
		return fieldErr("Memnode", "names a memory node already: nothing to embed")
	case cfg.MemnodeTLS.Enabled():
		return fieldErr("MemnodeTLS", "the embedded memory node speaks in clear on loopback: for TLS, run a memory node of its own and set Config.Memnode")
	case e.Memnodes > 1 && cfg.Replicas == 0 && cfg.EC.K == 0:
		return fieldErr("Replicas", "%d embedded memory nodes (EmbeddedConfig.Memnodes) serve replicated volumes: set it (or Config.EC for erasure-coded ones)", e.Memnodes)
	case cfg.EC.K > 0 && e.Memnodes < cfg.EC.Shards() && !cfg.Etcd.Enabled():
		return fieldErr("EC", "erasure code %s places each group on %d nodes: start as many (EmbeddedConfig.Memnodes)", cfg.EC, cfg.EC.Shards())
	case e.Memnodes > 1 && e.EtcdListen == "none" && !cfg.Etcd.Enabled():
		return fieldErr("EtcdListen", "none turns the embedded etcd off, and %d memory nodes (EmbeddedConfig.Memnodes) replicate volumes through the control plane: leave it on or set Config.Etcd", e.Memnodes)
	case e.Memnodes > 1 && e.MemnodeListen != "" && !strings.HasSuffix(e.MemnodeListen, ":0"):
		return fieldErr("MemnodeListen", "%d embedded memory nodes (EmbeddedConfig.Memnodes) cannot share %s: leave the port to the system (:0)", e.Memnodes, e.MemnodeListen)
	}
	return nil
}

// StartEmbedded starts what cfg lacks to run a host in this process: the
// control plane (unless cfg.Etcd names one) and the memory nodes, and
// points cfg at them. On an error, what it started is stopped again.
func StartEmbedded(ctx context.Context, cfg *Config, e EmbeddedConfig) (_ *Embedded, err error) {
	if err := e.Check(*cfg); err != nil {
		return nil, err
	}
	log := e.Log
	if log == nil {
		log = slog.Default()
	}
	m := &Embedded{}
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	if !cfg.Etcd.Enabled() && e.EtcdListen != "none" {
		dir := filepath.Join(e.Persist, "etcd")
		if e.Persist == "" {
			tmp, err := scratchDir("pd3-etcd-", log)
			if err != nil {
				return nil, err
			}
			m.closers = append(m.closers, func() error { return os.RemoveAll(tmp) })
			dir = tmp
		}
		srv, err := etcdembed.Start(ctx, etcdembed.Config{Dir: dir, ClientListen: e.EtcdListen})
		if err != nil {
			return nil, err
		}
		m.closers = append(m.closers, func() error { srv.Close(); return nil })
		m.Etcd = srv
		cfg.Etcd = cluster.Access{Endpoints: []string{srv.Endpoint}}
	}
	for i := range max(1, e.Memnodes) {
		persist := e.Persist
		if persist != "" && e.Memnodes > 1 {
			persist = filepath.Join(e.Persist, "memnode-"+strconv.Itoa(i))
		}
		node, err := StartMemnode(ctx, MemnodeConfig{Listen: e.MemnodeListen, Token: cfg.Token, Log: log, Persist: persist,
			Etcd: cfg.Etcd, Cluster: cfg.Cluster, Progress: e.Progress})
		if err != nil {
			return nil, err
		}
		m.closers = append(m.closers, node.Close)
		m.Nodes = append(m.Nodes, node)
	}
	if len(m.Nodes) == 1 {
		cfg.Memnode = m.Nodes[0].Addr
	}
	return m, nil
}

// Close stops the memory nodes, then etcd, and removes etcd's temporary
// data; stop the host first.
func (m *Embedded) Close() error {
	var err error
	for i := len(m.closers) - 1; i >= 0; i-- {
		err = errors.Join(err, m.closers[i]())
	}
	m.closers = nil
	return err
}

// scratchDir makes a temporary directory named PREFIX<pid>-*, removed by
// the caller on the way out. A pd3 killed with SIGKILL cannot remove its
// own, so first it removes those of processes that no longer run (a live
// pid, even another program's after reuse, keeps its directory).
func scratchDir(prefix string, log *slog.Logger) (string, error) {
	old, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*-*"))
	for _, d := range old {
		pidStr, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(d), prefix), "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			if os.RemoveAll(d) == nil {
				log.Info(fmt.Sprintf("removed %s, left by pd3 process %d that did not stop cleanly", d, pid))
			}
		}
	}
	return os.MkdirTemp("", prefix+strconv.Itoa(os.Getpid())+"-")
}
