package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/term"
)

// nodeCmd manages memory nodes through the control plane.
func nodeCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Drain, undrain and forget memory nodes (etcd)"}
	etcd := addEtcdFlags(cmd.PersistentFlags(), "etcd client URLs (comma-separated; pd3 up prints its embedded one)")
	cmd.MarkPersistentFlagRequired("etcd")
	var wait time.Duration
	drain := &cobra.Command{
		Use:   "drain ID",
		Short: "Move every extent of the replicated volumes off node ID, while clients go on; nothing new is placed there",
		Long: `Mark memory node ID draining (no volume or extent is placed there any more)
and ask the hosts of the replicated volumes it holds to move each of its
extents to another node: the extent is copied to the new node while its
writes go on, then the old replica is dropped and its memory freed. With
--wait (the default, 10m) the command shows the progress and returns once
the node holds nothing, or says what is left. pd3 node undrain ID takes the
mark off. Volumes of one node (not replicated) cannot move: they are named.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEtcd(cmd, etcd, wait, func(ctx context.Context, cli *clientv3.Client) error {
				id := args[0]
				nodes, err := cluster.Nodes(ctx, cli, etcd.cluster)
				if err != nil {
					return err
				}
				i := slices.IndexFunc(nodes, func(n cluster.Node) bool { return n.ID == id })
				if i < 0 {
					return fmt.Errorf("no memory node %s in cluster %s (pd3 cluster status lists them)", id, etcd.cluster)
				}
				if !nodes[i].Up {
					return fmt.Errorf("node %s is down: nothing can be copied off it (the hosts re-replicate what it held from the other copies); once no volume names it, pd3 node forget %s removes it", id, id)
				}
				if err := cluster.SetDraining(ctx, cli, etcd.cluster, id, true); err != nil {
					return err
				}
				for i := range nodes {
					if nodes[i].ID == id {
						nodes[i].Draining = true
					}
				}
				vols, err := cluster.Volumes(ctx, cli, etcd.cluster)
				if err != nil {
					return err
				}
				total := 0
				for _, v := range vols {
					switch {
					case v.EC != nil && slices.Contains(v.EC.Nodes(), id):
						fmt.Fprintf(cmd.ErrOrStderr(), "pd3: volume %s is erasure-coded (EC %s) with shards on node %s: they stay (moving coded shards is not supported yet)\n", v.Name, v.EC.Scheme, id)
					case v.Stripes == nil && v.Node == id:
						fmt.Fprintf(cmd.ErrOrStderr(), "pd3: volume %s lives on node %s alone (not replicated): it stays\n", v.Name, id)
					case v.Stripes != nil:
						// A filesystem's placement grows with its files:
						// it needs no room up front.
						need := v.Stripes.ExtentBytes
						if v.Filesystem {
							need = 0
						}
						moves, err := cluster.MovesOff(nodes, *v.Stripes, need, id, rand.IntN)
						if err != nil {
							return fmt.Errorf("volume %s: %w", v.Name, err)
						}
						if len(moves) > 0 {
							if _, err := cluster.AddMoves(ctx, cli, etcd.cluster, v.Name, moves); err != nil {
								return err
							}
						}
						total += len(moves)
					}
				}
				fmt.Fprintf(cmd.OutOrStdout(), "node %s draining: %d extents to move\n", id, total)
				if wait <= 0 || total == 0 {
					return nil
				}
				return waitMoves(ctx, cmd.ErrOrStderr(), cli, etcd.cluster, total, func(s cluster.Stripes) int {
					n := 0
					for e := range s.Extents {
						if slices.Contains(s.Writers(e), id) {
							n++
						}
					}
					return n
				})
			})
		},
	}
	drain.Flags().DurationVar(&wait, "wait", 10*time.Minute, "wait this long for the moves to finish, showing progress (0: return at once)")
	undrain := &cobra.Command{
		Use:   "undrain ID",
		Short: "Let node ID take volumes and extents again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEtcd(cmd, etcd, 0, func(ctx context.Context, cli *clientv3.Client) error {
				if err := cluster.SetDraining(ctx, cli, etcd.cluster, args[0], false); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "node %s takes volumes and extents again (pd3 cluster rebalance spreads what the others hold)\n", args[0])
				return nil
			})
		},
	}
	forget := &cobra.Command{
		Use:   "forget ID",
		Short: "Remove a memory node that is down for good from the cluster (no volume may name it)",
		Long: `Remove the record of memory node ID, which must be down and named by no
volume: a volatile node that died never comes back (it would register
anew), and stays listed down until it is forgotten. A volume that lives on
the node alone keeps it (remove the volume, or bring the node back); a
replicated volume names it until its host has dropped the node's
replicas, which a host serving the volume does on its own.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withEtcd(cmd, etcd, 0, func(ctx context.Context, cli *clientv3.Client) error {
				err := cluster.Forget(ctx, cli, etcd.cluster, args[0])
				switch {
				case errors.Is(err, cluster.ErrNodeUp):
					return fmt.Errorf("%w: stop it first (a volatile node that stops cleanly leaves by itself)", err)
				case errors.Is(err, cluster.ErrNodeHolds):
					return fmt.Errorf("%w: remove those that live on it alone (pd3 volume rm), or start a host for the replicated ones so that it drops the node's replicas", err)
				case err != nil:
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "node %s forgotten\n", args[0])
				return nil
			})
		},
	}
	cmd.AddCommand(drain, undrain, forget)
	return cmd
}

// withEtcd runs fn with a client of the control plane, within 30 s plus
// wait.
func withEtcd(cmd *cobra.Command, etcd *etcdFlags, wait time.Duration, fn func(context.Context, *clientv3.Client) error) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second+max(0, wait))
	defer cancel()
	cli, err := etcd.dial(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	return fn(ctx, cli)
}

// waitMoves shows the progress of total moves until left, counted over
// every replicated volume's map, reaches 0 and no move is pending.
func waitMoves(ctx context.Context, w io.Writer, cli *clientv3.Client, clusterName string, total int, left func(cluster.Stripes) int) error {
	var bar *progressbar.ProgressBar
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(w), progressbar.OptionShowCount(),
			progressbar.OptionSetDescription("moving extents"), progressbar.OptionClearOnFinish())
	}
	for {
		vols, err := cluster.Volumes(ctx, cli, clusterName)
		if err != nil {
			return err
		}
		remaining, pending := 0, 0
		for _, v := range vols {
			if v.Stripes != nil {
				remaining += left(*v.Stripes)
				pending += len(v.Stripes.Moves)
			}
		}
		if bar != nil {
			bar.Set(total - min(total, remaining))
		}
		if remaining == 0 && pending == 0 {
			if bar != nil {
				bar.Finish()
			}
			fmt.Fprintf(w, "pd3: %d extents moved\n", total)
			return nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("%d of %d extents still to move (is the volume's host running? it carries the moves out): the moves stay asked for", remaining, total)
			}
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
