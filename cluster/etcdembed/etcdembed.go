package etcdembed

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Config configures a member.
type Config struct {
	Dir string // data directory (required): etcd's WAL and snapshots
	// ClientListen is host:port for clients (default 127.0.0.1:0, a free
	// port); PeerListen likewise for the member's peer port, which a
	// single-member cluster never uses but etcd requires.
	ClientListen, PeerListen string
	Name                     string // member name (default "pd3")
	// InitialCluster lists every member of a new multi-member cluster as
	// NAME=http://HOST:PORT,... (their peer URLs; this member's must be
	// PeerListen). Empty: this member alone. Ignored by a member whose
	// data directory already holds the cluster.
	InitialCluster string
}

// Server is a running member.
type Server struct {
	e *embed.Etcd
	// Endpoint is the client URL, e.g. http://127.0.0.1:2379.
	Endpoint string
}

// Start starts a member and waits until it serves (or ctx ends).
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, fmt.Errorf("etcd: no data directory")
	}
	client, err := freeURL(cmp.Or(cfg.ClientListen, "127.0.0.1:0"))
	if err != nil {
		return nil, fmt.Errorf("etcd client address: %w", err)
	}
	peer, err := freeURL(cmp.Or(cfg.PeerListen, "127.0.0.1:0"))
	if err != nil {
		return nil, fmt.Errorf("etcd peer address: %w", err)
	}
	ec := embed.NewConfig()
	ec.Name = cmp.Or(cfg.Name, "pd3")
	ec.Dir = cfg.Dir
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	if cfg.InitialCluster != "" {
		ec.InitialCluster = cfg.InitialCluster
		ec.InitialClusterToken = "pd3"
	}
	// etcd logs JSON through zap, even at level error for a normal stop
	// ("use of closed network connection"); pd3's stderr is one format of
	// lines a user reads. What matters reaches us as errors: StartEtcd's
	// and the member's Err channel.
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd: %w", err)
	case <-ctx.Done():
		e.Close()
		return nil, ctx.Err()
	case <-time.After(time.Minute):
		e.Close()
		if cfg.InitialCluster != "" {
			return nil, fmt.Errorf("etcd: not ready after a minute: is a majority of %s running?", cfg.InitialCluster)
		}
		return nil, fmt.Errorf("etcd: not ready after a minute")
	}
	return &Server{e: e, Endpoint: client.String()}, nil
}

// freeURL resolves a host:port whose port may be 0 to a URL with a port
// free now: etcd's member list needs the real peer URL before it listens.
func freeURL(hostport string) (*url.URL, error) {
	_, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, err
	}
	if port == "0" {
		ln, err := net.Listen("tcp", hostport)
		if err != nil {
			return nil, err
		}
		hostport = ln.Addr().String()
		ln.Close()
	}
	return &url.URL{Scheme: "http", Host: hostport}, nil
}

// Close stops the member.
func (s *Server) Close() { s.e.Close() }
