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
	"text/tabwriter"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/cluster/etcdembed"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/memnode"
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
			vols, files, unreachable := volumesOf(ctx, nodes, token.Value(), holders)
			recs, err := cluster.Volumes(ctx, cli, name)
			if err != nil {
				return err
			}
			repl := replicationOf(recs, nodes)
			if asJSON {
				e := json.NewEncoder(cmd.OutOrStdout())
				e.SetIndent("", "  ")
				return e.Encode(map[string]any{"cluster": name, "nodes": nodes, "volumes": vols, "filesystem_volumes": files, "replicated": repl})
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "cluster %s: %d memory nodes\n", name, len(nodes))
			fmt.Fprintln(w, "NODE\tSTATE\tADDRESS\tCAPACITY\tIN USE\tSTARTED")
			for _, n := range nodes {
				capacity, used := "unlimited", "-"
				if n.Capacity > 0 {
					capacity = units.FormatSize(n.Capacity)
				}
				if n.Up {
					used = units.FormatSize(n.Stored)
				}
				state := n.State()
				if n.Draining {
					state += ",draining"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", n.ID, state, n.Addr, capacity, used, n.Started)
			}
			fmt.Fprintf(w, "\n%d volumes\n", len(vols))
			fmt.Fprintln(w, "VOLUME\tNODE\tSIZE\tSTORED\tHOLDER")
			for _, v := range vols {
				holder := "-"
				if v.Holder != nil {
					holder = v.Holder.String()
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", v.Name, v.Node, units.FormatSize(v.Size), units.FormatSize(v.Stored), holder)
			}
			if files.Count > 0 {
				fmt.Fprintf(w, "and %d filesystem volumes (files and metadata of pd3 mounts), %s stored\n", files.Count, units.FormatSize(files.Stored))
			}
			if len(repl) > 0 {
				fmt.Fprintf(w, "\n%d replicated volumes\n", len(repl))
				fmt.Fprintln(w, "VOLUME\tSIZE\tEXTENTS\tREPLICAS\tDEGRADED\tLOST\tEPOCH\tHEALTH")
				for _, r := range repl {
					fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", r.Name, units.FormatSize(r.Size), r.Extents, r.Replicas, r.Degraded, r.Lost, r.Epoch, r.Health)
				}
				for _, r := range repl {
					if r.Health != "healthy" {
						fmt.Fprintf(w, "%s: %s\n", r.Name, r.bar(30))
					}
				}
			}
			for _, u := range unreachable {
				fmt.Fprintf(w, "(node %s did not answer: %v)\n", u.ID, u.Err)
			}
			return w.Flush()
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

// replicaStatus is a replicated volume's health: its extents with fewer
// live replicas than wanted (on nodes dropped or down), and with none.
type replicaStatus struct {
	Name     string `json:"name"`
	Size     uint64 `json:"size"`
	Extents  int    `json:"extents"`
	Replicas int    `json:"replicas"`
	Degraded int    `json:"degraded"`
	Lost     int    `json:"lost"`
	Epoch    uint64 `json:"epoch"`
	Copying  int    `json:"copying"` // extents a repair is copying now
	Health   string `json:"health"`  // healthy, degraded or lost
}

// bar draws how much of the volume has all its replicas: the repair's
// progress, extent by extent.
func (r replicaStatus) bar(width int) string {
	whole := r.Extents - r.Degraded
	n := width * whole / max(1, r.Extents)
	return fmt.Sprintf("[%s%s] %d/%d extents with %d replicas, %d being copied", strings.Repeat("#", n), strings.Repeat(".", width-n),
		whole, r.Extents, r.Replicas, r.Copying)
}

func replicationOf(recs []cluster.VolumeRecord, nodes []cluster.Node) []replicaStatus {
	up := map[string]bool{}
	for _, n := range nodes {
		up[n.ID] = n.Up
	}
	var out []replicaStatus
	for _, r := range recs {
		s := r.Stripes
		if s == nil {
			continue
		}
		st := replicaStatus{Name: r.Name, Size: r.Size, Extents: len(s.Extents), Replicas: s.Replicas, Epoch: s.Epoch, Copying: s.Repairing(), Health: "healthy"}
		for _, e := range s.Extents {
			live := 0
			for _, id := range e {
				if up[id] {
					live++
				}
			}
			if live < s.Replicas {
				st.Degraded++
			}
			if live == 0 {
				st.Lost++
			}
		}
		switch {
		case st.Lost > 0:
			st.Health = "lost"
		case st.Degraded > 0:
			st.Health = "degraded"
		}
		out = append(out, st)
	}
	return out
}

// volumeStatus is a volume as pd3 cluster status shows it.
type volumeStatus struct {
	Name   string            `json:"name"`
	Node   string            `json:"node"`
	Size   uint64            `json:"size"`
	Stored uint64            `json:"stored"`
	Holder *cluster.HostInfo `json:"holder,omitempty"`
}

// fsVolumes sums up the volumes that hold pd3 filesystems (one per file,
// and their metadata): a listing of them would drown the rest.
type fsVolumes struct {
	Count  int    `json:"count"`
	Stored uint64 `json:"stored"`
}

type nodeErr struct {
	ID  string
	Err error
}

// volumesOf lists the volumes of every node that is up, asking the nodes
// themselves (what they store is theirs to say); pd3's own bookkeeping
// volumes (pd3.leases, pd3.epochs) are left out and filesystem volumes
// (fs.NAME.*) counted.
func volumesOf(ctx context.Context, nodes []cluster.Node, token string, holders map[string]cluster.HostInfo) ([]volumeStatus, fsVolumes, []nodeErr) {
	var out []volumeStatus
	var files fsVolumes
	var bad []nodeErr
	for _, n := range nodes {
		if !n.Up {
			continue
		}
		c, err := memnode.Dial(ctx, n.Addr, memnode.ClientOptions{Token: token, DialTimeout: 3 * time.Second, OpTimeout: 5 * time.Second})
		if err != nil {
			bad = append(bad, nodeErr{n.ID, err})
			continue
		}
		vs, err := c.List(ctx)
		c.Close()
		if err != nil {
			bad = append(bad, nodeErr{n.ID, err})
			continue
		}
		for _, v := range vs {
			if strings.HasPrefix(v.Name, "pd3.") {
				continue
			}
			if strings.HasPrefix(v.Name, "fs.") {
				files.Count++
				files.Stored += v.Stored
				continue
			}
			st := volumeStatus{Name: v.Name, Node: n.ID, Size: v.Size, Stored: v.Stored}
			if h, ok := holders[v.Name]; ok {
				st.Holder = &h
			}
			out = append(out, st)
		}
	}
	return out, files, bad
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
