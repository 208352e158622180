// Package bench is pd3's benchmark harness. Every benchmark measures the
// systems it compares back to back in one run and reports ratios, because
// these machines are noisy; the memory node and the host run as separate
// child processes (the pd3 binary itself) so that memory and CPU are
// reported per role.
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/pd3-go/pd3/internal/clilog"
	"github.com/pd3-go/pd3/internal/procstat"
	"github.com/pd3-go/pd3/internal/workload"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/prometheus/procfs"
)

// Result is one system's measurement. Fields that do not apply are zero
// and omitted from JSON.
type Result struct {
	System    string  `json:"system"`
	Config    string  `json:"config,omitempty"`
	Ops       uint64  `json:"ops"`
	OpsPerSec float64 `json:"ops_per_sec"`
	// RoundsOpsPerSec are the throughputs of every run of a row measured
	// in rounds (--rounds), ascending; the row itself is the median run.
	RoundsOpsPerSec []float64 `json:"rounds_ops_per_sec,omitempty"`
	GBytesPerSec    float64   `json:"gbytes_per_sec,omitempty"`
	P50us           float64   `json:"p50_us,omitempty"`
	P99us           float64   `json:"p99_us,omitempty"`
	HostCPUusOp     float64   `json:"host_cpu_us_per_op,omitempty"`
	AgentCPUusOp    float64   `json:"agent_cpu_us_per_op,omitempty"`
	// MemnodeCPUusOp is the memory node's CPU per operation where the
	// benchmark runs one (NBD, FUSE): on these machines it shares the
	// cores with the host and the clients.
	MemnodeCPUusOp float64 `json:"memnode_cpu_us_per_op,omitempty"`
	HostRSS        uint64  `json:"host_rss_bytes,omitempty"`
	MemnodeRSS     uint64  `json:"memnode_rss_bytes,omitempty"`
	MemnodeStored  uint64  `json:"memnode_stored_bytes,omitempty"`
	// MemnodePrivate is the part of MemnodeRSS that is the node's own
	// (procstat.Private): without its binary's file-backed text.
	MemnodePrivate uint64 `json:"memnode_private_bytes,omitempty"`
	Errors         uint64 `json:"errors"`
	// SendDelay*: open loop only, scheduled send time → sent, the
	// generator's own lateness plus any wait for a free requester.
	SendDelayP50us float64 `json:"send_delay_p50_us,omitempty"`
	SendDelayP99us float64 `json:"send_delay_p99_us,omitempty"`
	// Millis is the time of one timed operation (a full scan), where the
	// row measures one; OpsPerSec is then its rate.
	Millis float64 `json:"ms,omitempty"`
	// BudgetPeak is the most memory the application's cgroup held.
	BudgetPeak uint64 `json:"budget_peak_bytes,omitempty"`
	// Integrity is "ok" when the application's checks passed after the
	// run (amcheck, e2fsck), else what failed.
	Integrity string `json:"integrity,omitempty"`
	// The scale benchmark's: the times from starting a host to its NBD
	// server listening, first (creating the volumes) and again
	// (reopening them); the keys in etcd; the requests etcd received a
	// second with the host idle; the bytes of a volume's record.
	CreateMillis  float64 `json:"create_ms,omitempty"`
	OpenMillis    float64 `json:"open_ms,omitempty"`
	EtcdKeys      uint64  `json:"etcd_keys,omitempty"`
	EtcdReqPerSec float64 `json:"etcd_requests_per_sec,omitempty"`
	MapBytes      uint64  `json:"record_bytes,omitempty"`
	// Counters are the host's metrics over the measured interval
	// (counters as deltas, gauges at the end), without the pd3_ prefix.
	Counters map[string]float64 `json:"counters,omitempty"`
}

// LZHitRatio is the share of cache misses served by prefetching: from
// the Loading Zone, or from the host's read-ahead windows.
func (r Result) LZHitRatio() float64 {
	m := r.Counters["cache_misses_total"]
	if m == 0 {
		return 0
	}
	return min(1, (r.Counters["cache_loadingzone_hits_total"]+r.Counters["cache_readahead_hits_total"])/m)
}

// Report is what a benchmark prints.
type Report struct {
	Bench   string             `json:"bench"`
	Machine string             `json:"machine"`
	Results []Result           `json:"results"`
	Ratios  map[string]float64 `json:"ratios"`
	Notes   []string           `json:"notes,omitempty"`
}

// Machine describes where the benchmark ran.
func Machine() string {
	host, _ := os.Hostname()
	cpu, n := "unknown cpu", 0
	if fs, err := procfs.NewDefaultFS(); err == nil {
		if infos, err := fs.CPUInfo(); err == nil && len(infos) > 0 {
			cpu, n = infos[0].ModelName, len(infos)
		}
	}
	return fmt.Sprintf("%s, %d cpus, %s, Go processes GOMAXPROCS %d", host, n, cpu, runtime.GOMAXPROCS(0))
}

// Print writes r as JSON or as a table.
func (r *Report) Print(w io.Writer, asJSON bool) error {
	if asJSON {
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(r)
	}
	fmt.Fprintf(w, "%s on %s\n", r.Bench, r.Machine)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	switch r.Bench {
	case "apps":
		r.printApps(tw)
	case "scale":
		r.printScale(tw)
	default:
		r.printRows(tw)
	}
	tw.Flush()
	keys := make([]string, 0, len(r.Ratios))
	for k := range r.Ratios {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	single := false
	for _, k := range keys {
		v := r.Ratios[k]
		line := fmt.Sprintf("ratio %-28s %.3f", k, v)
		switch sp, ok := spreadOf(r, k); {
		case !ok:
		case sp == 0:
			single = true
		case sp >= math.Abs(v-1):
			line += fmt.Sprintf("  runs spread ±%.0f %%: WITHIN THE SPREAD, this run shows no difference", 100*sp)
		default:
			line += fmt.Sprintf("  runs spread ±%.0f %%", 100*sp)
		}
		fmt.Fprintln(w, line)
	}
	if single {
		fmt.Fprintln(w, "warning: one run per system, so the ratios carry no spread; one run on a shared VM can swing by a fifth or more: --rounds 3 reports medians and their spread")
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	return nil
}

func (r *Report) printRows(tw *tabwriter.Writer) {
	fmt.Fprintln(tw, "system\tconfig\tops/s\truns ops/s\tGB/s\tp50 µs\tp99 µs\thost CPU µs/op\tagent CPU µs/op\tmemnode CPU µs/op\thost RSS MiB\tmemnode RSS MiB\tstored MiB\tLZ hit%\tsend delay p99 µs\terrors\t")
	// A column a system has no measure of (no memory node, an agent in
	// the host's process, no Loading Zone) shows "-", not a zero.
	for _, x := range r.Results {
		lz := "-"
		if x.Counters != nil {
			lz = fmt.Sprintf("%.1f", 100*x.LZHitRatio())
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%.3f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t\n",
			x.System, x.Config, x.OpsPerSec, roundsRange(x), x.GBytesPerSec, orDash(x.P50us, 1), orDash(x.P99us, 1),
			orDash(x.HostCPUusOp, 2), orDash(x.AgentCPUusOp, 2), orDash(x.MemnodeCPUusOp, 2),
			orDash(mib(x.HostRSS), 1), orDash(mib(x.MemnodeRSS), 1), orDash(mib(x.MemnodeStored), 1), lz, sendDelay(x), x.Errors)
	}
}

// orDash prints v with prec decimals, or "-" for 0: not measured.
func orDash(v float64, prec int) string {
	if v == 0 {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

// printApps is the applications' table: throughput (or a timed
// operation), the export's costs, the prefetcher's accuracy and coverage,
// and whether the data survived.
func (r *Report) printApps(tw *tabwriter.Writer) {
	fmt.Fprintln(tw, "system\tworkload@budget\tops/s\truns ops/s\tms\tserver CPU µs/op\tremote CPU µs/op\tserver RSS MiB\tbudget peak MiB\taccuracy%\tcoverage%\tintegrity\t")
	for _, x := range r.Results {
		ms := "-"
		if x.Millis > 0 {
			ms = fmt.Sprintf("%.0f", x.Millis)
		}
		acc, cov := "-", "-"
		if x.Counters != nil {
			acc = fmt.Sprintf("%.0f", 100*x.PrefetchAccuracy())
			cov = fmt.Sprintf("%.0f", 100*x.LZHitRatio())
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%s\t%.2f\t%.2f\t%.0f\t%.0f\t%s\t%s\t%s\t\n",
			x.System, x.Config, x.OpsPerSec, roundsRange(x), ms, x.HostCPUusOp, x.MemnodeCPUusOp,
			mib(x.HostRSS), mib(x.BudgetPeak), acc, cov, x.Integrity)
	}
}

// roundsRange is a row's spread over its rounds, "-" for a single run.
func roundsRange(r Result) string {
	if len(r.RoundsOpsPerSec) < 2 {
		return "-"
	}
	return fmt.Sprintf("%.0f–%.0f", r.RoundsOpsPerSec[0], r.RoundsOpsPerSec[len(r.RoundsOpsPerSec)-1])
}

func sendDelay(r Result) string {
	if r.SendDelayP99us == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", r.SendDelayP99us)
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// Child is a pd3 process started by a benchmark.
type Child struct {
	cmd   *exec.Cmd
	Addrs map[string]string // "memory node", "page server" → address
	Pid   int

	// exited is closed once the child has exited and everything it
	// printed is in out.
	exited chan struct{}

	mu       sync.Mutex
	out      strings.Builder // stderr so far, in lines
	partial  []byte          // a line not yet ended
	want     []string
	found    chan struct{} // closed once every role in want has its address
	reported bool
}

// Output returns what the child has printed on stderr so far (pd3 logs
// there), in whole lines.
func (c *Child) Output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

// Nodes are a system's memory node processes (or a peer's remote
// server), measured as one: CPU and RSS summed. Nil entries are skipped
// (a system without one).
type Nodes []*Child

// Any reports whether there is a node to measure.
func (n Nodes) Any() bool {
	for _, c := range n {
		if c != nil {
			return true
		}
	}
	return false
}

// CPU is the nodes' CPU time so far.
func (n Nodes) CPU() time.Duration {
	var d time.Duration
	for _, c := range n {
		if c != nil {
			d += c.CPU()
		}
	}
	return d
}

// RSS is the nodes' resident memory.
func (n Nodes) RSS() uint64 {
	var b uint64
	for _, c := range n {
		if c != nil {
			b += c.RSS()
		}
	}
	return b
}

// Stored is the page memory the nodes serving /metrics have allocated
// (pd3_memnode_used_bytes, summed); 0 if none serves it.
func (n Nodes) Stored(ctx context.Context) uint64 {
	var b uint64
	for _, c := range n {
		if c == nil {
			continue
		}
		if url := c.Addrs["metrics"]; url != "" {
			if v, err := scrapeValues(ctx, url); err == nil {
				b += uint64(v["memnode_used_bytes"])
			}
		}
	}
	return b
}

// StartChild runs exe with args and waits until it has printed a
// "listening on ADDR" line for every role in want.
func StartChild(ctx context.Context, exe string, want []string, args ...string) (*Child, error) {
	return StartChildEnv(ctx, exe, nil, want, args...)
}

// StartChildEnv is StartChild with env added to the child's environment.
func StartChildEnv(ctx context.Context, exe string, env []string, want []string, args ...string) (*Child, error) {
	cmd := exec.Command(exe, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	c := &Child{cmd: cmd, Addrs: map[string]string{}, want: want, exited: make(chan struct{}), found: make(chan struct{})}
	// pd3 logs on stderr ("pd3: ..." lines): the child's notices are kept
	// for Output and its warnings and errors passed on to ours. exec
	// copies them to childLog and Wait returns once the copy is done, so
	// a child's last lines are never lost to its reaping (a pipe read by
	// a goroutine of ours lost them: Wait closes such a pipe); WaitDelay
	// bounds the copy if a process the child started keeps the pipe open.
	cmd.Stdout = os.Stderr
	cmd.Stderr = childLog{c}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s %v: %w", exe, args, err)
	}
	c.Pid = cmd.Process.Pid
	go func() {
		cmd.Wait()
		c.mu.Lock()
		if len(c.partial) > 0 {
			c.lineLocked(string(c.partial))
			c.partial = nil
		}
		c.mu.Unlock()
		close(c.exited)
	}()
	select {
	case <-c.found:
	case <-c.exited:
		select {
		case <-c.found: // said where it listens, then exited: the caller finds out
		default:
			return nil, fmt.Errorf("%s %v exited before listening:\n%s", exe, args, c.Output())
		}
	case <-time.After(2 * time.Minute):
		c.Stop()
		return nil, fmt.Errorf("%s %v did not start within 2 minutes", exe, args)
	case <-ctx.Done():
		c.Stop()
		return nil, ctx.Err()
	}
	return c, nil
}

// adoptChild makes a Child of a process started elsewhere, whose output
// is not kept (a peer's server, a FUSE daemon): Stop and Kill reap it.
func adoptChild(cmd *exec.Cmd) *Child {
	c := &Child{cmd: cmd, Pid: cmd.Process.Pid, Addrs: map[string]string{}, exited: make(chan struct{})}
	go func() { cmd.Wait(); close(c.exited) }()
	return c
}

// childLog takes a child's stderr in lines (StartChildEnv).
type childLog struct{ c *Child }

func (l childLog) Write(p []byte) (int, error) {
	c := l.c
	c.mu.Lock()
	defer c.mu.Unlock()
	c.partial = append(c.partial, p...)
	for {
		i := bytes.IndexByte(c.partial, '\n')
		if i < 0 {
			break
		}
		c.lineLocked(string(c.partial[:i]))
		c.partial = c.partial[i+1:]
	}
	c.partial = append(c.partial[:0:0], c.partial...) // let the consumed bytes go
	return len(p), nil
}

// lineLocked takes one line the child printed (c.mu held).
func (c *Child) lineLocked(line string) {
	c.out.WriteString(line + "\n")
	if strings.HasPrefix(line, clilog.Prefix+"warning: ") || strings.HasPrefix(line, clilog.Prefix+"error: ") {
		fmt.Fprintln(os.Stderr, line)
	}
	for _, role := range c.want {
		if rest, ok := strings.CutPrefix(line, clilog.Prefix+role+" listening on "); ok {
			c.Addrs[role] = strings.Fields(rest)[0]
		}
	}
	if !c.reported && len(c.Addrs) == len(c.want) {
		c.reported = true
		close(c.found)
	}
}

// WaitOutput waits until the child has printed s.
func (c *Child) WaitOutput(s string, timeout time.Duration) error {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if strings.Contains(c.Output(), s) {
			return nil
		}
	}
	return fmt.Errorf("no %q from the child within %v", s, timeout)
}

// RSS is the child's resident memory.
func (c *Child) RSS() uint64 { n, _ := procstat.RSS(c.Pid); return n }

// Private is the child's own resident memory (procstat.Private), 0 if unknown.
func (c *Child) Private() uint64 { n, _ := procstat.Private(c.Pid); return n }

// CPU is the child's CPU time so far.
func (c *Child) CPU() time.Duration { d, _ := procstat.CPU(c.Pid); return d }

// Stop ends the child with SIGTERM (SIGKILL after 30s) and reaps it.
func (c *Child) Stop() {
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(30 * time.Second):
		c.cmd.Process.Kill()
		<-c.exited
	}
}

// Kill ends the child at once (SIGKILL), as a crash would.
func (c *Child) Kill() {
	c.cmd.Process.Kill()
	<-c.exited
}

// Populate writes the pattern to every page of vol at the memory node,
// a chunk per request with several in flight.
func Populate(ctx context.Context, c *memnode.Client, vol pageid.VolumeInfo) error {
	const depth = 8
	bufs := make([][]byte, depth)
	calls := make([]memnode.Call, depth)
	for i := range bufs {
		bufs[i] = make([]byte, memnode.ChunkSize)
	}
	n := 0
	for off := uint64(0); off < vol.Size; off += memnode.ChunkSize {
		slot := n % depth
		if n >= depth {
			if err := calls[slot].Wait(ctx); err != nil {
				return fmt.Errorf("populating %s: %w", vol.Name, err)
			}
		}
		b := bufs[slot][:min(memnode.ChunkSize, vol.Size-off)]
		for p := 0; p < len(b); p += pageid.Size {
			workload.FillPage(pageid.MakeKey(vol.ID, (off+uint64(p))/pageid.Size), b[p:p+pageid.Size])
		}
		calls[slot] = c.WriteAsync(ctx, vol.ID, off, b)
		n++
	}
	for i := max(0, n-depth); i < n; i++ {
		if err := calls[i%depth].Wait(ctx); err != nil {
			return fmt.Errorf("populating %s: %w", vol.Name, err)
		}
	}
	return nil
}
