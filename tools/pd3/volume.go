package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"text/tabwriter"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/ec"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/replica"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// volumeCmd manages the volume records of the control plane and the
// volumes they name at the memory nodes.
func volumeCmd() *cobra.Command {
	var token *secretFlag
	cmd := &cobra.Command{Use: "volume", Short: "List, create and remove volumes through the control plane (etcd)"}
	etcd := addEtcdFlags(cmd.PersistentFlags(), "etcd client URLs (comma-separated; pd3 up prints its embedded one)")
	token = tokenFlag(cmd.PersistentFlags(), "memory-node access token (default $PD3_TOKEN)")
	cmd.MarkPersistentFlagRequired("etcd")
	// with runs fn with a client of the control plane, bounded in time.
	with := func(cmd *cobra.Command, fn func(ctx context.Context, cli *clientv3.Client) error) error {
		return withEtcd(cmd, etcd, 0, fn)
	}
	node := func(ctx context.Context, addr string) (*memnode.Client, error) {
		return memnode.Dial(ctx, addr, memnode.ClientOptions{Token: token.Value(), DialTimeout: 3 * time.Second, OpTimeout: 10 * time.Second})
	}

	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "Volumes (size, node, state, holder)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return with(cmd, func(ctx context.Context, cli *clientv3.Client) error {
				vols, err := cluster.Volumes(ctx, cli, etcd.cluster)
				if err != nil {
					return err
				}
				holders, err := cluster.Holders(ctx, cli, etcd.cluster)
				if err != nil {
					return err
				}
				type row struct {
					cluster.VolumeRecord
					Holder *cluster.HostInfo `json:"holder,omitempty"`
				}
				rows := make([]row, 0, len(vols))
				for _, v := range vols {
					r := row{VolumeRecord: v}
					if h, ok := holders[v.Name]; ok {
						r.Holder = &h
					}
					rows = append(rows, r)
				}
				if asJSON {
					e := json.NewEncoder(cmd.OutOrStdout())
					e.SetIndent("", "  ")
					return e.Encode(rows)
				}
				w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "VOLUME\tSIZE\tNODE\tSTATE\tHOLDER")
				for _, r := range rows {
					holder, node := "-", r.Node
					if r.Holder != nil {
						holder = r.Holder.String()
					}
					if r.Stripes != nil {
						node = fmt.Sprintf("%d nodes, R=%d", len(r.Stripes.Nodes()), r.Stripes.Replicas)
					} else if r.EC != nil {
						node = fmt.Sprintf("%d nodes, EC %s", len(r.EC.Nodes()), r.EC.Scheme)
					} else if node == "" {
						node = r.NodeAddr
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.Name, units.FormatSize(r.Size), node, r.State, holder)
				}
				return w.Flush()
			})
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	var size string
	var replicas int
	var code cluster.Scheme
	create := &cobra.Command{
		Use:   "create NAME --size SIZE",
		Short: "Create a volume on the memory node with the most room (of two drawn at random)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := units.ParseSize(size)
			if err != nil || n == 0 {
				return usageError{fmt.Errorf("--size %q: want a size such as 64MiB", size)}
			}
			if replicas > 0 && code.K > 0 {
				return usageError{errors.New("--replicas and --ec are two ways to survive lost nodes: give one")}
			}
			return with(cmd, func(ctx context.Context, cli *clientv3.Client) error {
				nodes, err := cluster.Nodes(ctx, cli, etcd.cluster)
				if err != nil {
					return err
				}
				if replicas > 0 || code.K > 0 {
					return createSpread(ctx, cmd.OutOrStdout(), cli, etcd.cluster, nodes, args[0], n, replicas, code, node)
				}
				target, err := cluster.Place(nodes, n, rand.IntN)
				if err != nil {
					return err
				}
				rec, err := cluster.ReserveVolume(ctx, cli, etcd.cluster, cluster.VolumeRecord{Name: args[0], Size: n,
					PageSize: pageid.Size, Node: target.ID, NodeAddr: target.Addr})
				if err != nil {
					return err
				}
				info, err := createAt(ctx, node, target, args[0], n)
				if err != nil {
					return errors.Join(err, cluster.DropVolume(ctx, cli, etcd.cluster, rec))
				}
				if _, err := cluster.VolumeCreated(ctx, cli, etcd.cluster, rec, info.ID, info.Size); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "volume %s: %s on node %s (%s)\n", args[0], units.FormatSize(info.Size), target.ID, target.Addr)
				return nil
			})
		},
	}
	create.Flags().StringVar(&size, "size", "", "volume size (e.g. 1GiB)")
	create.Flags().IntVar(&replicas, "replicas", 0, "stripe the volume over the cluster's nodes with this many copies of each 16 MiB extent (served with pd3 serve --replicas); 0: one node")
	create.Flags().Var(schemeValue{&code}, "ec", "erasure-code the volume: each group of K 16 MiB extents on K nodes with M parity extents on M more, surviving the loss of any M for (K+M)/K of the memory (e.g. 4+2); any host serving it with --etcd reads it so")
	create.MarkFlagRequired("size")

	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove a volume no host holds, and free its memory",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return with(cmd, func(ctx context.Context, cli *clientv3.Client) error {
				rec, err := cluster.GetVolume(ctx, cli, etcd.cluster, args[0])
				if err != nil {
					return err
				}
				if rec, err = cluster.MarkDeleting(ctx, cli, etcd.cluster, rec); err != nil {
					if errors.Is(err, pageid.ErrHeld) {
						err = fmt.Errorf("%w; stop the host serving it (pd3 cluster status shows which), then run pd3 volume rm again", err)
					}
					return err
				}
				// A volume over many nodes has a volume at every node of its
				// placement; every one of them must go before the record does.
				var addrs []string
				if ids := rec.Nodes(); ids != nil {
					for _, id := range ids {
						a, err := nodeAddr(ctx, cli, etcd.cluster, cluster.VolumeRecord{Node: id})
						if err != nil {
							return fmt.Errorf("volume %s stays marked %s: %w: run pd3 volume rm again once it is up", args[0], cluster.VolumeDeleting, err)
						}
						addrs = append(addrs, a)
					}
				} else {
					a, err := nodeAddr(ctx, cli, etcd.cluster, rec)
					if err != nil {
						return fmt.Errorf("volume %s stays marked %s: %w: run pd3 volume rm again once it is up", args[0], cluster.VolumeDeleting, err)
					}
					addrs = append(addrs, a)
				}
				for _, addr := range addrs {
					c, err := node(ctx, addr)
					if err != nil {
						return fmt.Errorf("volume %s stays marked %s: %w", args[0], cluster.VolumeDeleting, err)
					}
					err = c.Delete(ctx, args[0])
					c.Close()
					if err != nil && !errors.Is(err, pageid.ErrNoVolume) {
						return fmt.Errorf("volume %s stays marked %s: %w", args[0], cluster.VolumeDeleting, err)
					}
				}
				if err := cluster.DropVolume(ctx, cli, etcd.cluster, rec); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "volume %s removed: %s freed at %s\n", args[0], units.FormatSize(rec.Size), units.Count(len(addrs), "memory node", ""))
				return nil
			})
		},
	}
	var newSize string
	resize := &cobra.Command{
		Use:   "resize NAME --size SIZE",
		Short: "Grow a volume no host holds (volumes only grow; the new bytes read as zeroes)",
		Long: `Grow a volume no host holds. A served volume keeps its size: an NBD
client learns the size once, when it connects, so stop the host serving
the volume, resize, and start it again. Volumes only grow: shrinking would
drop data. A replicated volume's new extents are placed as at creation,
and its copy at every node of its map grows. A resize cut short (the
command killed, a node down) leaves the volume "resizing", and no host
takes it until resize runs again.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := units.ParseSize(newSize)
			if err != nil || n == 0 {
				return usageError{fmt.Errorf("--size %q: want a size such as 2GiB", newSize)}
			}
			return with(cmd, func(ctx context.Context, cli *clientv3.Client) error {
				rec, err := cluster.GetVolume(ctx, cli, etcd.cluster, args[0])
				if err != nil {
					return err
				}
				if n < rec.Size {
					return fmt.Errorf("volume %s is %s: it cannot shrink to %s (volumes only grow)", args[0], units.FormatSize(rec.Size), units.FormatSize(n))
				}
				if rec.EC != nil {
					return fmt.Errorf("volume %s is erasure-coded: resizing one is not supported yet; create a larger volume and copy it (nbdcopy)", args[0])
				}
				from := rec.Size
				if rec, err = cluster.MarkResizing(ctx, cli, etcd.cluster, rec); err != nil {
					if errors.Is(err, pageid.ErrHeld) {
						err = fmt.Errorf("%w; stop the host serving it, resize, and start it again (an NBD client learns the size when it connects)", err)
					}
					return err
				}
				if rec.Stripes != nil {
					return resizeReplicated(ctx, cmd.OutOrStdout(), cli, etcd.cluster, rec, n, node)
				}
				addr, err := nodeAddr(ctx, cli, etcd.cluster, rec)
				if err != nil {
					return fmt.Errorf("volume %s stays marked %s: %w", args[0], cluster.VolumeResizing, err)
				}
				c, err := node(ctx, addr)
				if err != nil {
					return fmt.Errorf("volume %s stays marked %s: %w", args[0], cluster.VolumeResizing, err)
				}
				info, err := c.Resize(ctx, args[0], n)
				c.Close()
				if errors.Is(err, memnode.ErrUnknownOp) {
					err = fmt.Errorf("%w (the memory node predates RESIZE: upgrade it)", err)
				}
				if err != nil {
					// The node refused (too large, shrinking after a
					// half-done larger resize): the volume is as it was.
					if cur, oerr := openAt(ctx, node, addr, args[0]); oerr == nil {
						_, uerr := cluster.VolumeResized(ctx, cli, etcd.cluster, rec, cur.Size)
						return errors.Join(err, uerr)
					}
					return fmt.Errorf("volume %s stays marked %s: %w", args[0], cluster.VolumeResizing, err)
				}
				if _, err := cluster.VolumeResized(ctx, cli, etcd.cluster, rec, info.Size); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "volume %s: %s -> %s\n", args[0], units.FormatSize(from), units.FormatSize(info.Size))
				return nil
			})
		},
	}
	resize.Flags().StringVar(&newSize, "size", "", "the new size (e.g. 2GiB)")
	resize.MarkFlagRequired("size")
	cmd.AddCommand(ls, create, rm, resize)
	return cmd
}

// createAt creates the volume at node n; a volume of that name already
// at the node (left by a host outside the control plane) is an error.
func createAt(ctx context.Context, dial func(context.Context, string) (*memnode.Client, error), n cluster.Node, vol string, size uint64) (pageid.VolumeInfo, error) {
	c, err := dial(ctx, n.Addr)
	if err != nil {
		return pageid.VolumeInfo{}, fmt.Errorf("node %s: %w", n.ID, err)
	}
	defer c.Close()
	info, err := c.Create(ctx, vol, size)
	if err != nil {
		return info, fmt.Errorf("node %s: %w", n.ID, err)
	}
	return info, nil
}

// nodeAddr is where the node holding rec listens now (it may have moved
// since the volume was placed), or the address recorded then for a node
// outside the control plane. A node that is down is an error.
func nodeAddr(ctx context.Context, cli *clientv3.Client, clusterName string, rec cluster.VolumeRecord) (string, error) {
	if rec.Node == "" {
		return rec.NodeAddr, nil
	}
	nodes, err := cluster.Nodes(ctx, cli, clusterName)
	if err != nil {
		return rec.NodeAddr, nil
	}
	for _, n := range nodes {
		if n.ID == rec.Node {
			if !n.Up {
				return "", fmt.Errorf("its memory node %s is down", n.ID)
			}
			return n.Addr, nil
		}
	}
	return rec.NodeAddr, nil
}

// openAt reads what the node at addr has of volume name.
func openAt(ctx context.Context, dial func(context.Context, string) (*memnode.Client, error), addr, name string) (pageid.VolumeInfo, error) {
	c, err := dial(ctx, addr)
	if err != nil {
		return pageid.VolumeInfo{}, err
	}
	defer c.Close()
	return c.Open(ctx, name)
}

// resizeReplicated grows replicated volume rec, marked resizing, through
// the nodes of its map.
func resizeReplicated(ctx context.Context, out io.Writer, cli *clientv3.Client, clusterName string, rec cluster.VolumeRecord, size uint64,
	dial func(context.Context, string) (*memnode.Client, error)) error {
	nodes, err := cluster.Nodes(ctx, cli, clusterName)
	if err != nil {
		return fmt.Errorf("volume %s stays marked %s: %w", rec.Name, cluster.VolumeResizing, err)
	}
	byID, closeAll := dialByID(ctx, nodes, dial)
	defer closeAll()
	from, extents := rec.Size, len(rec.Stripes.Extents)
	got, err := replica.Resize(ctx, cli, clusterName, nodes, rec, size, byID)
	if err != nil {
		return fmt.Errorf("volume %s stays marked %s: %w", rec.Name, cluster.VolumeResizing, err)
	}
	fmt.Fprintf(out, "volume %s: %s -> %s, %d extents -> %d\n", rec.Name, units.FormatSize(from), units.FormatSize(got.Size),
		extents, len(got.Stripes.Extents))
	return nil
}

// dialByID returns a node's client by id, dialled once (nil if the node
// is not up or cannot be reached), and a function closing them all.
func dialByID(ctx context.Context, nodes []cluster.Node, dial func(context.Context, string) (*memnode.Client, error)) (func(string) *memnode.Client, func()) {
	clients := map[string]*memnode.Client{}
	byID := func(id string) *memnode.Client {
		if c, ok := clients[id]; ok {
			return c
		}
		for _, n := range nodes {
			if n.ID == id && n.Up {
				c, _ := dial(ctx, n.Addr)
				clients[id] = c
				return c
			}
		}
		return nil
	}
	return byID, func() {
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
	}
}

// createSpread creates a replicated or erasure-coded volume through the
// control plane and the nodes of its placement, each reached once.
func createSpread(ctx context.Context, out io.Writer, cli *clientv3.Client, clusterName string, nodes []cluster.Node, name string, size uint64, replicas int,
	code cluster.Scheme, dial func(context.Context, string) (*memnode.Client, error)) error {
	byID, closeAll := dialByID(ctx, nodes, dial)
	defer closeAll()
	if code.K > 0 {
		rec, err := ec.Create(ctx, cli, clusterName, nodes, name, size, code, byID)
		if err != nil {
			return err
		}
		p := rec.EC
		fmt.Fprintf(out, "volume %s: %s, erasure code %s: %d groups of %d extents over %d nodes, %.2gx the memory\n", name, units.FormatSize(rec.Size),
			p.Scheme, len(p.Groups), p.K, len(p.Nodes()), float64(p.Shards())/float64(p.K))
		return nil
	}
	rec, err := replica.Create(ctx, cli, clusterName, nodes, name, size, replicas, byID)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "volume %s: %s in %d extents over %d nodes, %d replicas each\n", name, units.FormatSize(rec.Size),
		len(rec.Stripes.Extents), len(rec.Stripes.Nodes()), rec.Stripes.Replicas)
	return nil
}
