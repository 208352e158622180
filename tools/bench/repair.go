package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/tools/fio"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// RepairOptions configure the repair benchmark.
type RepairOptions struct {
	Exe      string
	Size     uint64 // volume size
	Nodes    int    // memory node processes (≥ Replicas+1)
	Replicas int
	Rate     uint64 // --repair-rate, bytes a second
	Timeout  time.Duration
}

// Repair measures how a replicated volume recovers from losing a memory
// node: a pd3 coord, Nodes memory node processes and a host serving one
// volume of Size with Replicas copies, filled with fio; then one node is
// SIGKILLed. Reported: the time until the control plane says the node is
// down (its lease), the time from then until every extent has Replicas
// replicas again (the repair), the repair's throughput, and the memory
// nodes' RSS per byte they store (memory overhead).
func Repair(ctx context.Context, opt RepairOptions) (*Report, error) {
	if opt.Nodes < opt.Replicas+1 || opt.Replicas < 2 {
		return nil, fmt.Errorf("bench: repair needs --replicas ≥ 2 and more nodes than replicas (have %d nodes, R=%d)", opt.Nodes, opt.Replicas)
	}
	dir, err := os.MkdirTemp("", "pd3-repair-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bc, err := startBenchCluster(ctx, opt.Exe, dir, opt.Nodes)
	if err != nil {
		return nil, err
	}
	defer bc.Stop()
	etcd, nodes := bc.Etcd, bc.Nodes
	host, err := StartChild(ctx, opt.Exe, []string{"NBD server"}, "serve", "--replicas", strconv.Itoa(opt.Replicas), "--etcd", etcd,
		"--volume", "disk0:"+strconv.FormatUint(opt.Size, 10), "--nbd", "127.0.0.1:0", "--page", "", "--dpu", "none",
		"--repair-rate", strconv.FormatUint(opt.Rate, 10))
	if err != nil {
		return nil, err
	}
	defer host.Stop()
	cli, err := cluster.Dial(ctx, cluster.Access{Endpoints: []string{etcd}})
	if err != nil {
		return nil, err
	}
	defer cli.Close()

	b, _ := fio.Jobs.ReadFile("fill.fio")
	job := filepath.Join(dir, "fill.fio")
	if err := os.WriteFile(job, b, 0o644); err != nil {
		return nil, err
	}
	env := []string{"NBD_URI=nbd://" + host.Addrs["NBD server"] + "/disk0", "SIZE=" + strconv.FormatUint(opt.Size, 10)}
	if _, err := runFio(ctx, job, env); err != nil {
		return nil, fmt.Errorf("filling the volume: %w", err)
	}
	// The host writes its cache back in the background: wait until the
	// nodes store every replica.
	want := uint64(opt.Replicas) * opt.Size
	var stored uint64
	if err := poll(ctx, opt.Timeout, func() (bool, error) {
		ns, err := cluster.Nodes(ctx, cli, "")
		stored = 0
		for _, n := range ns {
			stored += n.Stored
		}
		return stored >= want, err
	}); err != nil {
		return nil, fmt.Errorf("waiting for %s stored at the nodes (have %s): %w", units.FormatSize(want), units.FormatSize(stored), err)
	}
	var rss uint64
	for _, n := range nodes {
		rss += n.RSS()
	}

	rec, err := cluster.GetVolume(ctx, cli, "", "disk0")
	if err != nil {
		return nil, err
	}
	victim, err := nodeAt(ctx, cli, nodes[0].Addrs["memory node"])
	if err != nil {
		return nil, err
	}
	held := 0
	for _, e := range rec.Stripes.Extents {
		for _, id := range e {
			if id == victim {
				held++
			}
		}
	}
	killed := time.Now()
	if err := syscall.Kill(nodes[0].Pid, syscall.SIGKILL); err != nil {
		return nil, err
	}
	var down time.Time
	if err := poll(ctx, opt.Timeout, func() (bool, error) {
		ns, err := cluster.Nodes(ctx, cli, "")
		for _, n := range ns {
			if n.ID == victim && !n.Up {
				down = time.Now()
				return true, nil
			}
		}
		return false, err
	}); err != nil {
		return nil, fmt.Errorf("waiting for the killed node to be down: %w", err)
	}
	if err := poll(ctx, opt.Timeout, func() (bool, error) {
		r, err := cluster.GetVolume(ctx, cli, "", "disk0")
		if err != nil {
			return false, err
		}
		for e, reps := range r.Stripes.Extents {
			if len(reps) < opt.Replicas || len(r.Stripes.Writers(e)) != len(reps) {
				return false, nil
			}
			for _, id := range reps {
				if id == victim {
					return false, nil
				}
			}
		}
		return true, nil
	}); err != nil {
		return nil, fmt.Errorf("waiting for the volume to be whole again: %w", err)
	}
	healthy := time.Now()
	copied := uint64(held) * rec.Stripes.ExtentBytes
	repair := healthy.Sub(down)
	rep := &Report{Bench: "repair", Machine: Machine(), Ratios: map[string]float64{
		"memnode-rss/stored": float64(rss) / float64(stored),
		"repair-gib-per-s":   float64(copied) / (1 << 30) / repair.Seconds(),
		"seconds-to-down":    down.Sub(killed).Seconds(),
		"seconds-to-healthy": healthy.Sub(killed).Seconds(),
		"seconds-down-to-ok": repair.Seconds(),
	}}
	rep.Results = append(rep.Results, Result{System: "pd3-r" + strconv.Itoa(opt.Replicas), Config: "repair", Ops: uint64(held),
		GBytesPerSec: float64(copied) / 1e9 / repair.Seconds(), MemnodeRSS: rss, MemnodeStored: stored})
	rep.Notes = append(rep.Notes,
		fmt.Sprintf("%d memory nodes, R=%d, a %s volume filled with fio (1 MiB writes), %s stored at the nodes, their RSS %.0f MiB",
			opt.Nodes, opt.Replicas, units.FormatSize(opt.Size), units.FormatSize(stored), float64(rss)/(1<<20)),
		fmt.Sprintf("SIGKILL of one node holding %d of %d extents: down after %.1f s (its etcd lease), whole again %.1f s later (%s copied, --repair-rate %s/s); %.1f s in all",
			held, len(rec.Stripes.Extents), down.Sub(killed).Seconds(), repair.Seconds(), units.FormatSize(copied), units.FormatSize(opt.Rate), healthy.Sub(killed).Seconds()))
	return rep, nil
}

// benchCluster is a control plane (pd3 coord) and memory node processes
// registered with it, started for a benchmark.
type benchCluster struct {
	Etcd  string
	Nodes []*Child
	coord *Child
}

// startBenchCluster starts pd3 coord with its data in dir/etcd and n
// memory nodes (pd3 memnode --etcd, and nodeArgs); what it started is
// stopped again if a step fails.
func startBenchCluster(ctx context.Context, exe, dir string, n int, nodeArgs ...string) (_ *benchCluster, err error) {
	coord, err := StartChild(ctx, exe, []string{"etcd"}, "coord", "--listen", "127.0.0.1:0", "--dir", filepath.Join(dir, "etcd"))
	if err != nil {
		return nil, err
	}
	bc := &benchCluster{Etcd: coord.Addrs["etcd"], coord: coord}
	defer func() {
		if err != nil {
			bc.Stop()
		}
	}()
	want := []string{"memory node"}
	if slices.Contains(nodeArgs, "--metrics") {
		want = append(want, "metrics")
	}
	for range n {
		node, err := StartChild(ctx, exe, want, append([]string{"memnode", "--listen", "127.0.0.1:0", "--etcd", bc.Etcd}, nodeArgs...)...)
		if err != nil {
			return nil, err
		}
		bc.Nodes = append(bc.Nodes, node)
	}
	return bc, nil
}

// Stop stops the memory nodes, then the control plane.
func (bc *benchCluster) Stop() {
	for _, n := range slices.Backward(bc.Nodes) {
		n.Stop()
	}
	bc.coord.Stop()
}

// nodeAt is the id of the node registered at addr.
func nodeAt(ctx context.Context, cli *clientv3.Client, addr string) (string, error) {
	ns, err := cluster.Nodes(ctx, cli, "")
	if err != nil {
		return "", err
	}
	for _, n := range ns {
		if n.Addr == addr {
			return n.ID, nil
		}
	}
	return "", fmt.Errorf("no node registered at %s", addr)
}

// poll calls f every 100 ms until it reports done, fails, or timeout.
func poll(ctx context.Context, timeout time.Duration, f func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		done, err := f()
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("not after %v", timeout)
			}
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
