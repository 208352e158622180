package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/cluster/etcdembed"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func clusterCmd() *cobra.Command {
	var etcd *etcdFlags
	var asJSON bool
	var token *secretFlag
	cmd := &cobra.Command{Use: "cluster", Short: "The cluster as its control plane (etcd) sees it"}
	status := &cobra.Command{
		Use:   "status",
		Short: "Memory nodes (up or down, capacity, memory in use) and volumes (size, holder)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 20*time.Second)
			defer cancel()
			cli, err := etcd.dial(ctx)
			if err != nil {
				return err
			}
			name := etcd.cluster
			defer cli.Close()
			nodes, err := cluster.Nodes(ctx, cli, name)
			if err != nil {
				return err
			}
			holders, err := cluster.Holders(ctx, cli, name)
			if err != nil {
				return err
			}
			recs, err := cluster.Volumes(ctx, cli, name)
			if err != nil {
				return err
			}
			st := statusOf(ctx, name, nodes, recs, holders, token.Value())
			if asJSON {
				e := json.NewEncoder(cmd.OutOrStdout())
				e.SetIndent("", "  ")
				return e.Encode(st)
			}
			return st.print(cmd.OutOrStdout())
		},
	}
	etcd = addEtcdFlags(cmd.PersistentFlags(), "etcd client URLs (comma-separated; pd3 up prints its embedded one)")
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	token = tokenFlag(status.Flags(), "memory-node access token, to list the nodes' volumes (default $PD3_TOKEN)")
	cmd.MarkPersistentFlagRequired("etcd")
	var wait time.Duration
	rebalance := &cobra.Command{
		Use:   "rebalance",
		Short: "Move extents of replicated volumes so that every node up holds its share (after adding a node)",
		Long: `Even out the extents of the replicated volumes over the memory nodes that are
up and not draining: extents of the fullest nodes move to the emptiest,
while clients go on (each is copied, then the old replica dropped). The
volumes' hosts carry the moves out; with --wait (the default, 10m) the
command shows the progress and returns once they are done.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withEtcd(cmd, etcd, wait, func(ctx context.Context, cli *clientv3.Client) error {
				nodes, err := cluster.Nodes(ctx, cli, etcd.cluster)
				if err != nil {
					return err
				}
				vols, err := cluster.Volumes(ctx, cli, etcd.cluster)
				if err != nil {
					return err
				}
				total := 0
				for vol, moves := range cluster.RebalanceMoves(nodes, vols) {
					if _, err := cluster.AddMoves(ctx, cli, etcd.cluster, vol, moves); err != nil {
						return err
					}
					total += len(moves)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%d extents to move\n", total)
				if wait <= 0 || total == 0 {
					return nil
				}
				return waitMoves(ctx, cmd.ErrOrStderr(), cli, etcd.cluster, total, func(s cluster.Stripes) int { return len(s.Moves) })
			})
		},
	}
	rebalance.Flags().DurationVar(&wait, "wait", 10*time.Minute, "wait this long for the moves to finish, showing progress (0: return at once)")
	cmd.AddCommand(status, rebalance)
	return cmd
}

func coordCmd() *cobra.Command {
	var listen, peer, dir, name, initial string
	cmd := &cobra.Command{
		Use:   "coord",
		Short: "Run an etcd member: the control plane for a cluster without one",
		Long: `Run an etcd member (the same embedded etcd pd3 up starts) for memory nodes
and hosts to share: pd3 memnode --etcd URL registers with it. Its data lives
in --dir and survives restarts.

Alone by default. For a control plane that survives the loss of a member,
run three (or five) on different machines, each with its own --name and
the same --initial-cluster listing every member's peer URL, e.g.
  --initial-cluster a=http://10.0.0.1:2380,b=http://10.0.0.2:2380,c=http://10.0.0.3:2380
and give clients every member's client URL (--etcd URL1,URL2,URL3). A
member waits for a majority before it says it listens. A restarted member
finds the cluster in its --dir.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if initial != "" && !cmd.Flags().Changed("peer-listen") {
				p, err := memberPeer(initial, name)
				if err != nil {
					return usageError{err}
				}
				peer = p
			}
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			srv, err := etcdembed.Start(ctx, etcdembed.Config{Dir: dir, ClientListen: listen, PeerListen: peer, Name: name, InitialCluster: initial})
			if err != nil {
				return err
			}
			defer srv.Close()
			log := logger()
			log.Info(fmt.Sprintf("etcd listening on %s (member %s, data in %s)", srv.Endpoint, name, dir))
			stopping := notifyReady(ctx, log, "etcd listening on "+srv.Endpoint)
			<-ctx.Done()
			stopping()
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:2379", "client address")
	cmd.Flags().StringVar(&peer, "peer-listen", "127.0.0.1:0", "peer address (default: this member's in --initial-cluster; a single member never uses it)")
	cmd.Flags().StringVar(&dir, "dir", "./pd3-coord", "data directory")
	cmd.Flags().StringVar(&name, "name", "pd3", "member name, unique in the cluster")
	cmd.Flags().StringVar(&initial, "initial-cluster", "", "every member of a new cluster: NAME=http://HOST:PEERPORT,... (empty: this member alone)")
	return cmd
}

// memberPeer returns the host:port of member name in an --initial-cluster
// list.
func memberPeer(initial, name string) (string, error) {
	for _, m := range strings.Split(initial, ",") {
		n, u, ok := strings.Cut(m, "=")
		if !ok {
			return "", fmt.Errorf("--initial-cluster: %q is not NAME=URL", m)
		}
		if n != name {
			continue
		}
		pu, err := url.Parse(u)
		if err != nil || pu.Host == "" {
			return "", fmt.Errorf("--initial-cluster: member %s: %q is not a peer URL such as http://10.0.0.1:2380", n, u)
		}
		return pu.Host, nil
	}
	return "", fmt.Errorf("--initial-cluster does not list this member (--name %s)", name)
}
