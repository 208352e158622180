package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/internal/scrape"
	"github.com/pd3-go/pd3/internal/units"
)

// ScaleOptions configure the scale benchmark.
type ScaleOptions struct {
	Exe string
	// Sweeps are the dimensions swept: "volumes" (Volumes volumes of
	// 16 MiB on one host) and "size" (one volume of each of Sizes, Written
	// bytes of it written and read back).
	Sweeps  []string
	Volumes []int
	Sizes   []uint64
	Written uint64
	Nodes   int    // memory node processes
	Cache   uint64 // the host's --cache
	// Idle is how long etcd's requests are counted with the host idle.
	Idle     time.Duration
	Progress Progress
}

// ScaleSweeps are the dimensions pd3 bench scale measures.
var ScaleSweeps = []string{"volumes", "size"}

// Scale measures how pd3's costs grow with its work, each configuration
// in fresh processes on loopback (pd3 coord, Nodes pd3 memnode, one pd3
// serve placing its volumes through the control plane): the time to
// create and to reopen the volumes, the host's RSS, the nodes' RSS per
// byte they store, the keys in etcd and the requests etcd serves a
// second while the host is idle, and the bytes of a volume's record.
func Scale(ctx context.Context, opt ScaleOptions) (*Report, error) {
	opt.Nodes = max(opt.Nodes, 1)
	rep := &Report{Bench: "scale", Machine: Machine(), Ratios: map[string]float64{}}
	type config struct {
		name    string
		volumes []string // NAME:SIZE
		write   uint64   // bytes written to the first volume and read back
	}
	var cfgs []config
	for _, s := range opt.Sweeps {
		switch s {
		case "volumes":
			for _, n := range opt.Volumes {
				c := config{name: fmt.Sprintf("volumes=%d", n)}
				for i := range n {
					c.volumes = append(c.volumes, fmt.Sprintf("v%d:16MiB", i))
				}
				cfgs = append(cfgs, c)
			}
		case "size":
			for _, size := range opt.Sizes {
				cfgs = append(cfgs, config{name: "size=" + units.FormatSize(size), volumes: []string{"disk0:" + strconv.FormatUint(size, 10)},
					write: min(size, opt.Written)})
			}
		default:
			return nil, fmt.Errorf("bench: scale: unknown sweep %q (have %s)", s, strings.Join(ScaleSweeps, ", "))
		}
	}
	pr := progressOr(opt.Progress)
	pr.Begin(len(cfgs))
	defer pr.End()
	for _, c := range cfgs {
		pr.Step(c.name)
		r, err := scaleRun(ctx, opt, c.volumes, c.write)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		r.System, r.Config = "pd3", c.name
		rep.Results = append(rep.Results, r)
	}
	for _, sw := range [][2]string{{"volumes", "volumes="}, {"size", "size="}} {
		var first, last *Result
		for i := range rep.Results {
			if strings.HasPrefix(rep.Results[i].Config, sw[1]) {
				if first == nil {
					first = &rep.Results[i]
				}
				last = &rep.Results[i]
			}
		}
		if first == nil || first == last {
			continue
		}
		rep.Ratios["host_rss:"+last.Config+"/"+first.Config] = float64(last.HostRSS) / float64(first.HostRSS)
		rep.Ratios["etcd_rps:"+last.Config+"/"+first.Config] = last.EtcdReqPerSec / max(first.EtcdReqPerSec, 0.01)
	}
	for _, r := range rep.Results {
		if r.MemnodeStored > 0 && strings.HasPrefix(r.Config, "size=") {
			rep.Ratios["memnode_rss/stored:"+r.Config] = float64(r.MemnodeRSS) / float64(r.MemnodeStored)
		}
	}
	rep.Notes = append(rep.Notes, fmt.Sprintf("each configuration in fresh processes on loopback: pd3 coord, %s (volatile), one pd3 serve --etcd (no --memnode: the control plane places the volumes, R=1) --cache %s --dpu none; "+
		"create and reopen are the times from starting the host to its NBD server listening, the first start and a second; etcd req/s are the gRPC messages etcd received a second over %v with the host idle; "+
		"node RSS/stored is the nodes' RSS over the page memory they hold (their Go runtime and binary included)",
		units.Count(opt.Nodes, "pd3 memnode", ""), units.FormatSize(opt.Cache), opt.Idle))
	return rep, nil
}

// scaleRun starts a cluster and a host serving volumes, writes write
// bytes of the first and reads them back, and measures.
func scaleRun(ctx context.Context, opt ScaleOptions, volumes []string, write uint64) (Result, error) {
	var r Result
	dir, err := os.MkdirTemp("", "pd3-scale-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	bc, err := startBenchCluster(ctx, opt.Exe, dir, opt.Nodes, "--metrics", "127.0.0.1:0")
	if err != nil {
		return r, err
	}
	defer bc.Stop()
	etcd, nodes := bc.Etcd, bc.Nodes
	args := []string{"serve", "--etcd", etcd, "--nbd", "127.0.0.1:0", "--page", "", "--dpu", "none", "--cache", strconv.FormatUint(opt.Cache, 10)}
	for _, v := range volumes {
		args = append(args, "--volume", v)
	}
	start := func() (*Child, time.Duration, error) {
		t0 := time.Now()
		h, err := StartChild(ctx, opt.Exe, []string{"NBD server"}, args...)
		return h, time.Since(t0), err
	}
	host, took, err := start()
	if err != nil {
		return r, err
	}
	r.CreateMillis = ms(took)
	if write > 0 {
		name, _, _ := strings.Cut(volumes[0], ":")
		uri := "nbd://" + host.Addrs["NBD server"] + "/" + name
		// Written in 1 MiB writes, then read back and checked.
		res, err := runFioArgs(ctx, []string{"--name=written", "--ioengine=nbd", "--uri=" + uri, "--rw=write", "--bs=1m", "--iodepth=8",
			"--size=" + strconv.FormatUint(write, 10), "--verify=crc32c", "--do_verify=1", "--verify_fatal=1"}, nil)
		if err != nil {
			host.Stop()
			return r, err
		}
		r.Ops, r.GBytesPerSec = res.Ops, res.GBytesPerSec
	}
	if r.EtcdReqPerSec, err = etcdIdleRate(ctx, etcd, opt.Idle); err != nil {
		host.Stop()
		return r, err
	}
	r.HostRSS = host.RSS()
	host.Stop()
	host, took, err = start()
	if err != nil {
		return r, err
	}
	defer host.Stop()
	r.OpenMillis = ms(took)
	for _, n := range nodes {
		r.MemnodeRSS += n.RSS()
		if v, err := scrapeValues(ctx, n.Addrs["metrics"]); err == nil {
			r.MemnodeStored += uint64(v["memnode_used_bytes"])
		}
	}
	mfs, err := scrape.Families(ctx, etcd+"/metrics")
	if err != nil {
		return r, err
	}
	if mf := mfs["etcd_debugging_mvcc_keys_total"]; mf != nil && len(mf.GetMetric()) > 0 {
		r.EtcdKeys = uint64(mf.GetMetric()[0].GetGauge().GetValue())
	}
	cli, err := cluster.Dial(ctx, cluster.Access{Endpoints: []string{etcd}})
	if err != nil {
		return r, err
	}
	defer cli.Close()
	name, _, _ := strings.Cut(volumes[0], ":")
	rec, err := cluster.GetVolume(ctx, cli, "", name)
	if err != nil {
		return r, err
	}
	b, _ := json.Marshal(rec)
	r.MapBytes = uint64(len(b))
	return r, nil
}

// etcdIdleRate is the gRPC messages etcd at url receives a second over d.
func etcdIdleRate(ctx context.Context, url string, d time.Duration) (float64, error) {
	count := func() (float64, error) {
		mfs, err := scrape.Families(ctx, url+"/metrics")
		if err != nil {
			return 0, err
		}
		var n float64
		for _, m := range mfs["grpc_server_msg_received_total"].GetMetric() {
			n += m.GetCounter().GetValue()
		}
		return n, nil
	}
	a, err := count()
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(d):
	}
	b, err := count()
	if err != nil {
		return 0, err
	}
	return (b - a) / time.Since(t0).Seconds(), nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// printScale is the scale benchmark's table.
func (r *Report) printScale(tw *tabwriter.Writer) {
	fmt.Fprintln(tw, "system\tconfig\tcreate ms\treopen ms\thost RSS MiB\tnode RSS MiB\tstored MiB\tnode RSS/stored\tetcd keys\tetcd req/s idle\trecord bytes\twritten GB/s\t")
	for _, x := range r.Results {
		perByte := "-"
		if x.MemnodeStored > 0 {
			perByte = fmt.Sprintf("%.2f", float64(x.MemnodeRSS)/float64(x.MemnodeStored))
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%.1f\t%.1f\t%.1f\t%s\t%d\t%.1f\t%d\t%s\t\n",
			x.System, x.Config, x.CreateMillis, x.OpenMillis, mib(x.HostRSS), mib(x.MemnodeRSS), mib(x.MemnodeStored), perByte,
			x.EtcdKeys, x.EtcdReqPerSec, x.MapBytes, opt(x.GBytesPerSec, 3))
	}
}
