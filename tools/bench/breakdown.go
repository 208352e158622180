package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pd3-go/pd3/internal/nbdclient"
	"github.com/pd3-go/pd3/internal/procstat"
	"github.com/pd3-go/pd3/internal/stages"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/tools/fio"
)

// BreakdownOptions configure the miss-path breakdown.
type BreakdownOptions struct {
	Exe      string
	Size     uint64
	Cache    uint64
	Requests int // reads per system, one at a time
	// ReadBytes is each read's size (default 4 KiB). Reads of more than a
	// page take paths the stages are not stamped on (pd3 serves them as
	// streams): their rows report end-to-end times and each process's CPU.
	ReadBytes uint64
	// DPU is pd3's --dpu (default embedded).
	DPU string
}

// ProcCPU is one process's CPU time per read of a breakdown row.
type ProcCPU struct {
	Process   string  `json:"process"`
	PerReadUs float64 `json:"per_read_us"`
}

// StageTime is one stage's share of a request: the time from the stage
// before it to this one.
type StageTime struct {
	Stage    string  `json:"stage"`
	P50us    float64 `json:"p50_us"`
	P90us    float64 `json:"p90_us"`
	Requests int     `json:"requests"`
}

// BreakdownRow is one system's queue-depth-1 read: its end-to-end latency
// as the client sees it and, for pd3, where that time went.
type BreakdownRow struct {
	System   string      `json:"system"`
	What     string      `json:"what"`
	Requests int         `json:"requests"`
	P50us    float64     `json:"p50_us"`
	P90us    float64     `json:"p90_us"`
	Stages   []StageTime `json:"stages,omitempty"`
	// CPU is each server process's CPU time (user and system) per read.
	CPU []ProcCPU `json:"cpu,omitempty"`
}

// Breakdown is the report of NBDBreakdown.
type Breakdown struct {
	Machine string         `json:"machine"`
	Rows    []BreakdownRow `json:"rows"`
	Notes   []string       `json:"notes"`
}

// The stages a pd3 miss and a pd3 hit pass, in order.
var (
	missStages = []stages.Stage{stages.ClientSent, stages.HostRequestRead, stages.HostDispatched, stages.HostRemoteSent,
		stages.NodeRequestRead, stages.NodeServed, stages.NodeReplyWritten, stages.HostRemoteDone, stages.HostReplyWritten, stages.ClientReceived}
	hitStages = []stages.Stage{stages.ClientSent, stages.HostRequestRead, stages.HostDispatched, stages.HostReplyWritten, stages.ClientReceived}
)

// NBDBreakdown reads one 4 KiB page at a time with pd3's own NBD client
// and stamps every stage of each read in a shared-memory recorder that
// the client, pd3's host and its memory node (separate processes) write:
// a pd3 miss (data at the memory node, 64 MiB cache over the export), a
// pd3 hit (pd3-local: every page cached), and, for the same client, the
// two nbdkit peers (one crossing to nbdkit memory; two through the cache
// chain) as end-to-end times.
func NBDBreakdown(ctx context.Context, opt BreakdownOptions) (*Breakdown, error) {
	if opt.Requests <= 0 {
		opt.Requests = 20000
	}
	if opt.ReadBytes == 0 {
		opt.ReadBytes = 4096
	}
	if opt.ReadBytes%4096 != 0 || opt.ReadBytes > 32<<20 || opt.ReadBytes > opt.Size {
		return nil, fmt.Errorf("a breakdown read of %d bytes: a multiple of 4 KiB up to 32 MiB and the export's size", opt.ReadBytes)
	}
	dir, err := os.MkdirTemp("", "pd3-breakdown-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	fill, _ := fio.Jobs.ReadFile("fill.fio")
	if err := os.WriteFile(filepath.Join(dir, "fill.fio"), fill, 0o644); err != nil {
		return nil, err
	}
	name := fmt.Sprintf("stages-%d", os.Getpid())
	rec, err := stages.Create(name)
	if err != nil {
		return nil, err
	}
	defer rec.Close()
	env := []string{"PD3_STAGES=" + name}
	out := &Breakdown{Machine: Machine()}
	size := strconv.FormatUint(opt.Size, 10)

	type proc struct {
		name string
		pid  int
	}
	type system struct {
		name, what string
		start      func() (uri string, stop func(), procs []proc, err error)
		want       []stages.Stage // nil: end to end only
	}
	systems := []system{
		{"pd3", "miss: data at the memory node", func() (string, func(), []proc, error) {
			node, err := StartChildEnv(ctx, opt.Exe, env, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0")
			if err != nil {
				return "", nil, nil, err
			}
			host, err := StartChildEnv(ctx, opt.Exe, env, []string{"NBD server"}, "serve", "--memnode", node.Addrs["memory node"],
				"--volume", "disk0:"+size, "--cache", strconv.FormatUint(opt.Cache, 10), "--nbd", "127.0.0.1:0", "--page", "", "--dpu", opt.dpu())
			if err != nil {
				node.Stop()
				return "", nil, nil, err
			}
			return "nbd://" + host.Addrs["NBD server"] + "/disk0", func() { host.Stop(); node.Stop() },
				[]proc{{"host", host.Pid}, {"memory node", node.Pid}}, nil
		}, missStages},
		{"pd3-local", "hit: every page in the host cache", func() (string, func(), []proc, error) {
			host, err := StartChildEnv(ctx, opt.Exe, env, []string{"NBD server"}, "serve", "--local",
				"--volume", "disk0:"+size, "--nbd", "127.0.0.1:0", "--page", "")
			if err != nil {
				return "", nil, nil, err
			}
			return "nbd://" + host.Addrs["NBD server"] + "/disk0", host.Stop, []proc{{"host", host.Pid}}, nil
		}, hitStages},
		{"nbdkit-memory", "one crossing to a C server holding the data", func() (string, func(), []proc, error) {
			c, addr, err := startNbdkit(ctx, nil, "memory", size)
			if err != nil {
				return "", nil, nil, err
			}
			return "nbd://" + addr, c.Stop, []proc{{"nbdkit", c.Pid}}, nil
		}, nil},
		{"nbdkit-nbd", "every read crosses to a second nbdkit: the floor of a miss without polling", func() (string, func(), []proc, error) {
			remote, raddr, err := startNbdkit(ctx, nil, "memory", size)
			if err != nil {
				return "", nil, nil, err
			}
			front, addr, err := startNbdkit(ctx, nil, "nbd", "uri=nbd://"+raddr+"/")
			if err != nil {
				remote.Stop()
				return "", nil, nil, err
			}
			return "nbd://" + addr, func() { front.Stop(); remote.Stop() }, []proc{{"front nbdkit", front.Pid}, {"back nbdkit", remote.Pid}}, nil
		}, nil},
		{"nbdkit-cache-nbd", "nbdkit's cache filter over its nbd plugin to a second nbdkit", func() (string, func(), []proc, error) {
			front, remote, addr, err := startNbdkitCacheChain(ctx, opt.Size, opt.Cache, false)
			if err != nil {
				return "", nil, nil, err
			}
			return "nbd://" + addr, func() { front.Stop(); remote.Stop() }, []proc{{"front nbdkit", front.Pid}, {"back nbdkit", remote.Pid}}, nil
		}, nil},
	}
	large := opt.ReadBytes > 4096
	for _, sys := range systems {
		uri, stop, procs, err := sys.start()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sys.name, err)
		}
		if _, err := runFio(ctx, filepath.Join(dir, "fill.fio"), []string{"NBD_URI=" + uri, "SIZE=" + size}); err != nil {
			stop()
			return nil, fmt.Errorf("%s: filling: %w", sys.name, err)
		}
		want := sys.want
		if large {
			want = nil
		}
		before := make([]time.Duration, len(procs))
		for i, p := range procs {
			before[i], _ = procstat.CPU(p.pid)
		}
		row, err := breakdownRun(uri, opt, rec, want)
		for i, p := range procs {
			if after, cerr := procstat.CPU(p.pid); cerr == nil && err == nil {
				row.CPU = append(row.CPU, ProcCPU{Process: p.name, PerReadUs: us(after-before[i]) / float64(opt.Requests)})
			}
		}
		stop()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sys.name, err)
		}
		row.System, row.What = sys.name, sys.what
		if sys.name == "pd3" {
			row.What += ", agent " + opt.dpu()
		}
		out.Rows = append(out.Rows, row)
	}
	if large {
		out.Notes = append(out.Notes, fmt.Sprintf("%d reads of %s per system at queue depth 1, uniform and aligned; pd3 serves reads from --nbd-stream-from (64 KiB) up as streams, not cached; no stages are stamped on that path: end-to-end times and each server process's CPU (user and system) per read",
			opt.Requests, units.FormatSize(opt.ReadBytes)))
		return out, nil
	}
	for _, f := range crossingFloors {
		row, err := runCrossingFloor(ctx, opt.Exe, f, opt.Requests)
		if err != nil {
			return nil, err
		}
		out.Rows = append(out.Rows, row)
	}
	out.Notes = append(out.Notes, "go-* rows: the crossing floor, Go processes that pass a 28-byte request and a 4 KiB answer over loopback TCP and do nothing else (pd3 bench crossing-server), sleeping in poll(2) as pd3 does or busy-polling")
	out.Notes = append(out.Notes, fmt.Sprintf("%d one-page reads per system at queue depth 1 (pd3's Go NBD client, uniform over %s); pd3 %s cache, agent %s; a stage's time runs from the stage before it; pd3 rows count only the reads that took that path (misses, hits), stamped by client, host and memory node in one shared-memory recorder",
		opt.Requests, units.FormatSize(opt.Size), units.FormatSize(opt.Cache), opt.dpu()))
	return out, nil
}

// dpu is pd3's agent mode in the breakdown (embedded unless DPU says).
func (o BreakdownOptions) dpu() string { return cmp.Or(o.DPU, "embedded") }

// breakdownRun reads opt.Requests random pages one at a time; with want,
// it keeps the reads in which every stage of want was stamped, in order,
// after the read was sent.
func breakdownRun(uri string, opt BreakdownOptions, rec *stages.Recorder, want []stages.Stage) (BreakdownRow, error) {
	host, export, _ := strings.Cut(strings.TrimPrefix(uri, "nbd://"), "/")
	c, err := nbdclient.Dial(host, export)
	if err != nil {
		return BreakdownRow{}, err
	}
	defer c.Close()
	rng := rand.New(rand.NewPCG(7, 11))
	page := make([]byte, opt.ReadBytes)
	var total []float64
	per := make([][]float64, len(want))
	for i := 0; i < opt.Requests; i++ {
		off := rng.Uint64N(opt.Size/opt.ReadBytes) * opt.ReadBytes
		rec.Stamp(stages.ClientSent)
		t0 := time.Now()
		if err := c.Read(off, page); err != nil {
			return BreakdownRow{}, err
		}
		el := time.Since(t0)
		rec.Stamp(stages.ClientReceived)
		if want == nil {
			total = append(total, us(el))
			continue
		}
		at := make([]int64, len(want))
		ok := true
		for j, s := range want {
			at[j] = rec.At(s)
			if j > 0 && at[j] < at[j-1] {
				ok = false // a stage of another path, or of an earlier read
			}
		}
		if !ok {
			continue
		}
		total = append(total, float64(at[len(at)-1]-at[0])/1e3)
		for j := 1; j < len(at); j++ {
			per[j] = append(per[j], float64(at[j]-at[j-1])/1e3)
		}
	}
	row := BreakdownRow{Requests: len(total)}
	if len(total) == 0 {
		return row, fmt.Errorf("no read took the expected path")
	}
	row.P50us, row.P90us = quantile(total, 0.5), quantile(total, 0.9)
	for j := 1; j < len(want); j++ {
		row.Stages = append(row.Stages, StageTime{Stage: want[j].String(), P50us: quantile(per[j], 0.5), P90us: quantile(per[j], 0.9), Requests: len(per[j])})
	}
	return row, nil
}

func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// Print writes the breakdown as tables.
func (b *Breakdown) Print(w io.Writer) {
	fmt.Fprintf(w, "nbd breakdown on %s\n", b.Machine)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "system\twhat\treads\tp50 µs\tp90 µs\tCPU µs per read\t")
	for _, r := range b.Rows {
		var cpu []string
		for _, c := range r.CPU {
			cpu = append(cpu, fmt.Sprintf("%s %.1f", c.Process, c.PerReadUs))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f\t%.1f\t%s\t\n", r.System, r.What, r.Requests, r.P50us, r.P90us, strings.Join(cpu, ", "))
	}
	tw.Flush()
	for _, r := range b.Rows {
		if len(r.Stages) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s (%s), per stage:\n", r.System, r.What)
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "stage\tp50 µs\tp90 µs\t")
		for _, s := range r.Stages {
			fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t\n", s.Stage, s.P50us, s.P90us)
		}
		tw.Flush()
	}
	for _, n := range b.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}
