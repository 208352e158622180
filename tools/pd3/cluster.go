package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/cluster/etcdembed"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/spf13/cobra"
)

func clusterCmd() *cobra.Command {
	var etcd []string
	var name string
	var asJSON bool
	cmd := &cobra.Command{Use: "cluster", Short: "The cluster as its control plane (etcd) sees it"}
	status := &cobra.Command{
		Use:   "status",
		Short: "Memory nodes: up or down, address, capacity and memory in use",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 20*time.Second)
			defer cancel()
			cli, err := cluster.Dial(ctx, etcd)
			if err != nil {
				return err
			}
			defer cli.Close()
			nodes, err := cluster.Nodes(ctx, cli, name)
			if err != nil {
				return err
			}
			if asJSON {
				e := json.NewEncoder(cmd.OutOrStdout())
				e.SetIndent("", "  ")
				return e.Encode(map[string]any{"cluster": name, "nodes": nodes})
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
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", n.ID, n.State(), n.Addr, capacity, used, n.Started)
			}
			return w.Flush()
		},
	}
	cmd.PersistentFlags().StringSliceVar(&etcd, "etcd", nil, "etcd client URLs (comma-separated; pd3 up prints its embedded one)")
	cmd.PersistentFlags().StringVar(&name, "cluster", cluster.DefaultName, "cluster name")
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.MarkPersistentFlagRequired("etcd")
	cmd.AddCommand(status)
	return cmd
}

func coordCmd() *cobra.Command {
	var listen, peer, dir string
	cmd := &cobra.Command{
		Use:   "coord",
		Short: "Run a standalone etcd member: the control plane for a cluster without one",
		Long: `Run a single-member etcd (the same embedded etcd pd3 up starts) for memory
nodes and hosts to share: pd3 memnode --etcd URL registers with it. Its data
lives in --dir and survives restarts.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			srv, err := etcdembed.Start(ctx, etcdembed.Config{Dir: dir, ClientListen: listen, PeerListen: peer})
			if err != nil {
				return err
			}
			defer srv.Close()
			log := logger()
			log.Info(fmt.Sprintf("etcd listening on %s (data in %s)", srv.Endpoint, dir))
			stopping := notifyReady(ctx, log, "etcd listening on "+srv.Endpoint)
			<-ctx.Done()
			stopping()
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:2379", "client address")
	cmd.Flags().StringVar(&peer, "peer-listen", "127.0.0.1:0", "peer address (a single member never uses it)")
	cmd.Flags().StringVar(&dir, "dir", "./pd3-coord", "data directory")
	return cmd
}
