package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/internal/scrape"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/tools/fio"
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
	Nodes   int    // memory node processes (volumes and size sweeps)
	Cache   uint64 // the host's --cache
	// NodeCounts and HostCounts are the nodes and hosts sweeps: one host
	// over each count of nodes at R=2 (R=1 over one node), and each count
	// of hosts over HostNodes nodes, every host with a volume of its own;
	// fio randread Q32 and randwrite Q32 with a FLUSH every 32 writes run
	// Runtime (after Ramp) on each host's volume of IOSize, filled first.
	NodeCounts, HostCounts []int
	HostNodes              int
	IOSize                 uint64
	Runtime, Ramp          time.Duration
	// NodeArgs are added to every memory node's command line.
	NodeArgs []string
	// Idle is how long etcd's requests are counted with the host idle.
	Idle time.Duration
	// Rounds runs the nodes and hosts sweeps this many times, the
	// configurations taking turns in fresh processes, and reports each
	// row's median run (by ops/s, whole: CPU and latency from the same
	// run); the volumes and size sweeps run once.
	Rounds   int
	Progress Progress
}

// ScaleSweeps are the dimensions pd3 bench scale measures.
var ScaleSweeps = []string{"volumes", "size", "nodes", "hosts"}

// scaleJobs are the fio jobs of the nodes and hosts sweeps.
var scaleJobs = []string{"randread-q32t1", "randwrite-q32-flush32"}

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
		// io, if set, runs the configuration instead (nodes, hosts).
		io func() ([]Result, error)
	}
	jobDir, err := os.MkdirTemp("", "pd3-scale-jobs-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(jobDir)
	for _, j := range append([]string{"fill"}, scaleJobs...) {
		b, err := fio.Jobs.ReadFile(j + ".fio")
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(jobDir, j+".fio"), b, 0o644); err != nil {
			return nil, err
		}
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
		case "nodes":
			for _, n := range opt.NodeCounts {
				cfgs = append(cfgs, config{name: fmt.Sprintf("nodes=%d", n), io: func() ([]Result, error) {
					return scaleIO(ctx, opt, jobDir, fmt.Sprintf("nodes=%d", n), n, 1, false)
				}})
			}
		case "hosts":
			for _, h := range opt.HostCounts {
				cfgs = append(cfgs, config{name: fmt.Sprintf("hosts=%d", h), io: func() ([]Result, error) {
					rs, err := scaleIO(ctx, opt, jobDir, fmt.Sprintf("hosts=%d", h), opt.HostNodes, h, false)
					if err != nil {
						return nil, err
					}
					// The ceiling in the same run: as many nbdkit memory
					// servers, each a host's data in its own memory.
					ceil, err := scaleIO(ctx, opt, jobDir, fmt.Sprintf("hosts=%d", h), 0, h, true)
					return append(rs, ceil...), err
				}})
			}
		default:
			return nil, fmt.Errorf("bench: scale: unknown sweep %q (have %s)", s, strings.Join(ScaleSweeps, ", "))
		}
	}
	rounds := max(opt.Rounds, 1)
	ios := 0
	for _, c := range cfgs {
		if c.io != nil {
			ios++
		}
	}
	pr := progressOr(opt.Progress)
	pr.Begin(len(cfgs) + (rounds-1)*ios)
	defer pr.End()
	// runs holds each I/O row's runs, by system and config, in the
	// order the first round made them.
	var order []string
	runs := map[string][]Result{}
	for round := 1; round <= rounds; round++ {
		at := ""
		if rounds > 1 {
			at = fmt.Sprintf(" (round %d/%d)", round, rounds)
		}
		for _, c := range cfgs {
			if c.io == nil {
				continue
			}
			pr.Step(c.name + at)
			rs, err := c.io()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", c.name, err)
			}
			for _, r := range rs {
				k := r.System + "\x00" + r.Config
				if runs[k] == nil {
					order = append(order, k)
				}
				runs[k] = append(runs[k], r)
			}
		}
	}
	for _, c := range cfgs {
		if c.io != nil {
			continue
		}
		pr.Step(c.name)
		r, err := scaleRun(ctx, opt, c.volumes, c.write)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		r.System, r.Config = "pd3", c.name
		rep.Results = append(rep.Results, r)
	}
	for _, k := range order {
		rep.Results = append(rep.Results, medianRun(runs[k]))
	}
	if rounds > 1 && len(order) > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("nodes and hosts rows: each the median run of %d (by ops/s, whole: latency and CPU from the same run), the configurations taking turns in fresh processes; the range of ops/s is the runs'", rounds))
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
	scaleSizeRatios(rep)
	scaleIORatios(rep)
	for _, r := range rep.Results {
		if r.OpenMillis > 0 && strings.HasPrefix(r.Config, "volumes=") {
			rep.Ratios["open_s:"+r.Config] = r.OpenMillis / 1000
		}
	}
	if slices.ContainsFunc(opt.Sweeps, func(s string) bool { return s == "volumes" || s == "size" }) {
		rep.Notes = append(rep.Notes, fmt.Sprintf("volumes and size rows: each configuration in fresh processes on loopback: pd3 coord, %s (volatile), one pd3 serve --etcd (no --memnode: the control plane places the volumes, R=1) --cache %s --dpu none; "+
			"create and reopen are the times from starting the host to its NBD server listening, the first start and a second; etcd req/s are the gRPC messages etcd received a second over %v with the host idle; "+
			"node RSS/stored is the nodes' RSS over the page memory they hold (their Go runtime and binary included)",
			units.Count(opt.Nodes, "pd3 memnode", ""), units.FormatSize(opt.Cache), opt.Idle))
	}
	if slices.ContainsFunc(opt.Sweeps, func(s string) bool { return s == "nodes" || s == "hosts" }) {
		rep.Notes = append(rep.Notes, fmt.Sprintf("nodes and hosts rows: pd3 coord, the nodes, and each host a pd3 serve --etcd --replicas 2 (1 over one node) --dpu none --cache %s of a %s volume of its own, filled first; "+
			"fio (ioengine=nbd, 4 KiB) runs %v after %v ramp on every host at once; ops/s is their sum, p99 the worst host's, CPU per operation the hosts' (or nodes') CPU over all operations, etcd req/s during the job; "+
			"hosts=H nbdkit-memory is the ceiling in the same run: H nbdkit memory servers under the same fio",
			units.FormatSize(opt.Cache), units.FormatSize(opt.IOSize), opt.Runtime, opt.Ramp))
	}
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
			"--size=" + strconv.FormatUint(write, 10), "--verify=crc32c", "--do_verify=1", "--verify_fatal=1",
			"--verify_state_save=0"}, nil) // no local-written-0-verify.state left in the working directory
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
	r.EtcdKeys = uint64(scrape.Sum(mfs, "etcd_debugging_mvcc_keys_total"))
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
	a, err := etcdReceived(ctx, url)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(d):
	}
	b, err := etcdReceived(ctx, url)
	if err != nil {
		return 0, err
	}
	return (b - a) / time.Since(t0).Seconds(), nil
}

// etcdReceived is the gRPC messages (requests, and messages on streams:
// lease keep-alives, watches) etcd at url has received.
func etcdReceived(ctx context.Context, url string) (float64, error) {
	mfs, err := scrape.Families(ctx, url+"/metrics")
	if err != nil {
		return 0, err
	}
	return scrape.Sum(mfs, "grpc_server_msg_received_total"), nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// printScale is the scale benchmark's table: the cost rows (volumes,
// size) and the I/O rows (nodes, hosts); a column a row does not measure
// shows "-".
func (r *Report) printScale(tw *tabwriter.Writer) {
	fmt.Fprintln(tw, "system\tconfig\tops/s\truns ops/s\tp99 µs\thost CPU µs/op\tnode CPU µs/op\tcreate ms\treopen ms\thost RSS MiB\tnode RSS MiB\tstored MiB\tnode RSS/stored\tetcd keys\tetcd req/s\trecord bytes\twritten GB/s\t")
	for _, x := range r.Results {
		perByte := "-"
		if v, ok := rssPerStored(x); ok {
			perByte = fmt.Sprintf("%.2f", v)
		}
		keys, record, written := "-", "-", "-"
		if x.EtcdKeys > 0 {
			keys = strconv.FormatUint(x.EtcdKeys, 10)
		}
		if x.MapBytes > 0 {
			record = strconv.FormatUint(x.MapBytes, 10)
		}
		if x.CreateMillis > 0 {
			written = orDash(x.GBytesPerSec, 3)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			x.System, x.Config, orDash(x.OpsPerSec, 0), roundsRange(x), orDash(x.P99us, 0), orDash(x.HostCPUusOp, 2), orDash(x.MemnodeCPUusOp, 2),
			orDash(x.CreateMillis, 0), orDash(x.OpenMillis, 0), orDash(mib(x.HostRSS), 1), orDash(mib(x.MemnodeRSS), 1), orDash(mib(x.MemnodeStored), 1), perByte,
			keys, orDash(x.EtcdReqPerSec, 1), record, written)
	}
}

// scaleSizeRatios adds the size sweep's ratios of memory: the nodes' RSS
// per byte they store at each size, and the two that hold bytes written
// apart from volume size (a volume smaller than --written has less
// written): the host's RSS at the largest size against the smallest size
// with as many bytes stored, and the nodes' RSS added per byte stored
// added from the smallest size to the largest (their fixed cost, the
// runtime and binary, left out).
func scaleSizeRatios(rep *Report) {
	var sizes []*Result
	for i := range rep.Results {
		r := &rep.Results[i]
		if !strings.HasPrefix(r.Config, "size=") {
			continue
		}
		sizes = append(sizes, r)
		if v, ok := rssPerStored(*r); ok {
			rep.Ratios["memnode_rss/stored:"+r.Config] = v
		}
	}
	if len(sizes) < 2 {
		return
	}
	first, last := sizes[0], sizes[len(sizes)-1]
	for _, r := range sizes[:len(sizes)-1] {
		if r.MemnodeStored == last.MemnodeStored && r.HostRSS > 0 {
			rep.Ratios["host_rss:"+last.Config+"/"+r.Config] = float64(last.HostRSS) / float64(r.HostRSS)
			break
		}
	}
	if last.MemnodeStored > first.MemnodeStored && last.MemnodeRSS > first.MemnodeRSS {
		rep.Ratios["memnode_rss_added/stored_added:"+last.Config+"/"+first.Config] =
			float64(last.MemnodeRSS-first.MemnodeRSS) / float64(last.MemnodeStored-first.MemnodeStored)
	}
}

// rssPerStored is the nodes' RSS per byte of pages they hold; ok is
// false where the row stored nothing.
func rssPerStored(r Result) (float64, bool) {
	if r.MemnodeStored == 0 {
		return 0, false
	}
	return float64(r.MemnodeRSS) / float64(r.MemnodeStored), true
}

// scaleIO runs the fio jobs on hosts hosts over nodes memory nodes (R=2,
// or R=1 over one node), each host serving a volume of its own, all
// hosts' fio at once; with ceiling, on hosts nbdkit memory servers
// instead. A row per job: throughput summed over the hosts, the worst
// host's p50/p99, CPU per operation of the hosts and of the nodes, and
// the requests etcd received a second during the job.
func scaleIO(ctx context.Context, opt ScaleOptions, jobDir, name string, nodes, hosts int, ceiling bool) ([]Result, error) {
	dir, err := os.MkdirTemp("", "pd3-scale-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	size := strconv.FormatUint(opt.IOSize, 10)
	var uris []string
	var procs, nodeProcs []*Child
	etcd := ""
	sys := "pd3"
	if ceiling {
		sys = "nbdkit-memory"
		for range hosts {
			c, addr, err := startNbdkit(ctx, nil, "memory", size)
			if err != nil {
				return nil, err
			}
			defer c.Stop()
			procs, uris = append(procs, c), append(uris, "nbd://"+addr)
		}
	} else {
		bc, err := startBenchCluster(ctx, opt.Exe, dir, nodes, opt.NodeArgs...)
		if err != nil {
			return nil, err
		}
		defer bc.Stop()
		etcd, nodeProcs = bc.Etcd, bc.Nodes
		replicas := strconv.Itoa(min(2, nodes))
		for i := range hosts {
			vol := fmt.Sprintf("h%d", i)
			h, err := StartChild(ctx, opt.Exe, []string{"NBD server"}, "serve", "--etcd", etcd, "--replicas", replicas,
				"--volume", vol+":"+size, "--cache", strconv.FormatUint(opt.Cache, 10), "--nbd", "127.0.0.1:0", "--page", "", "--dpu", "none")
			if err != nil {
				return nil, err
			}
			defer h.Stop()
			procs, uris = append(procs, h), append(uris, "nbd://"+h.Addrs["NBD server"]+"/"+vol)
		}
	}
	env := func(uri string) []string {
		return []string{"NBD_URI=" + uri, "SIZE=" + size, "RUNTIME=" + strconv.Itoa(int(opt.Runtime.Seconds())), "RAMP=" + strconv.Itoa(int(opt.Ramp.Seconds()))}
	}
	if _, err := onEach(uris, func(uri string) (Result, error) { return runFio(ctx, filepath.Join(jobDir, "fill.fio"), env(uri)) }); err != nil {
		return nil, fmt.Errorf("filling: %w", err)
	}
	cpu := func(cs []*Child) (d time.Duration) {
		for _, c := range cs {
			d += c.CPU()
		}
		return d
	}
	var out []Result
	for _, job := range scaleJobs {
		hcpu0, ncpu0 := cpu(procs), cpu(nodeProcs)
		var etcd0 float64
		if etcd != "" {
			if etcd0, err = etcdReceived(ctx, etcd); err != nil {
				return nil, err
			}
		}
		t0 := time.Now()
		rs, err := onEach(uris, func(uri string) (Result, error) { return runFio(ctx, filepath.Join(jobDir, job+".fio"), env(uri)) })
		if err != nil {
			return nil, fmt.Errorf("%s: %w", job, err)
		}
		r := Result{System: sys, Config: name + " " + job}
		for _, x := range rs {
			r.Ops += x.Ops
			r.OpsPerSec += x.OpsPerSec
			r.GBytesPerSec += x.GBytesPerSec
			r.P50us, r.P99us = max(r.P50us, x.P50us), max(r.P99us, x.P99us)
			r.Errors += x.Errors
		}
		if r.Ops > 0 {
			r.HostCPUusOp = us(cpu(procs)-hcpu0) / float64(r.Ops)
			r.MemnodeCPUusOp = us(cpu(nodeProcs)-ncpu0) / float64(r.Ops)
		}
		if etcd != "" {
			n, err := etcdReceived(ctx, etcd)
			if err != nil {
				return nil, err
			}
			r.EtcdReqPerSec = (n - etcd0) / time.Since(t0).Seconds()
		}
		for _, p := range procs {
			r.HostRSS = max(r.HostRSS, p.RSS())
		}
		out = append(out, r)
	}
	return out, nil
}

// onEach runs f on every uri at once and returns their results in order.
func onEach(uris []string, f func(string) (Result, error)) ([]Result, error) {
	rs := make([]Result, len(uris))
	errs := make([]error, len(uris))
	done := make(chan struct{})
	for i, u := range uris {
		go func() { rs[i], errs[i] = f(u); done <- struct{}{} }()
	}
	for range uris {
		<-done
	}
	return rs, errors.Join(errs...)
}

// scaleIORatios adds the nodes and hosts sweeps' ratios: host CPU per
// operation at the most nodes over one node's, and the aggregate of the
// most hosts over one host's, for pd3 and for the ceiling.
func scaleIORatios(rep *Report) {
	row := func(sys, cfg string) *Result {
		for i := range rep.Results {
			if rep.Results[i].System == sys && rep.Results[i].Config == cfg {
				return &rep.Results[i]
			}
		}
		return nil
	}
	counts := func(prefix string) (lo, hi int) {
		lo = -1
		for _, r := range rep.Results {
			var n int
			if _, err := fmt.Sscanf(r.Config, prefix+"=%d", &n); err == nil {
				if lo < 0 || n < lo {
					lo = n
				}
				hi = max(hi, n)
			}
		}
		return lo, hi
	}
	for _, job := range scaleJobs {
		if lo, hi := counts("nodes"); lo >= 0 && hi > lo {
			a, b := row("pd3", fmt.Sprintf("nodes=%d %s", hi, job)), row("pd3", fmt.Sprintf("nodes=%d %s", lo, job))
			if a != nil && b != nil && b.HostCPUusOp > 0 {
				rep.Ratios[fmt.Sprintf("host_cpu_per_op:nodes=%d/nodes=%d@%s", hi, lo, job)] = a.HostCPUusOp / b.HostCPUusOp
			}
		}
		if lo, hi := counts("hosts"); lo >= 0 && hi > lo {
			for _, sys := range []string{"pd3", "nbdkit-memory"} {
				a, b := row(sys, fmt.Sprintf("hosts=%d %s", hi, job)), row(sys, fmt.Sprintf("hosts=%d %s", lo, job))
				if a != nil && b != nil && b.OpsPerSec > 0 {
					rep.Ratios[fmt.Sprintf("aggregate:%s hosts=%d/hosts=%d@%s", sys, hi, lo, job)] = a.OpsPerSec / b.OpsPerSec
				}
			}
		}
	}
}
