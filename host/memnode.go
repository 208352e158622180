package host

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/internal/netsrv"
	"github.com/pd3-go/pd3/internal/stages"
	"github.com/pd3-go/pd3/internal/tlsfiles"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	clientv3 "go.etcd.io/etcd/client/v3"
)

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
	// Metrics, if set, is the address to serve /metrics on (Prometheus
	// text), bound before the node serves.
	Metrics string
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
	// MetricsAddr is where /metrics is served ("" without
	// MemnodeConfig.Metrics).
	MetricsAddr string
	// ID is the node's id in the cluster ("" without Etcd).
	ID   string
	done chan error
	// stopMetrics stops the /metrics server (nil without one).
	stopMetrics func() error
	reg         *cluster.Registration
	etcd        *clientv3.Client

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
	if cfg.Metrics != "" {
		if m.MetricsAddr, m.stopMetrics, err = ServeRegistry(ctx, cfg.Metrics, m.Registry()); err != nil {
			ln.Close()
			store.Close()
			return nil, fmt.Errorf("memory node: %w", err)
		}
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
		if m.stopMetrics != nil {
			m.stopMetrics()
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
