package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The results page: a section per suite, a missing run said to be
// missing, a pivoted table of medians with their ranges, and each goal
// met, not met, or within the runs' spread.
func TestRenderReport(t *testing.T) {
	rep := &Report{Bench: "page", Machine: "vm, 2 cpus", Results: []Result{
		{System: "local", Config: "dist=uniform", OpsPerSec: 1000, RoundsOpsPerSec: []float64{900, 1000, 1100}},
		{System: "sync", Config: "dist=uniform", OpsPerSec: 200, RoundsOpsPerSec: []float64{200, 200, 200}},
		{System: "pd3", Config: "dist=uniform", OpsPerSec: 650, RoundsOpsPerSec: []float64{600, 650, 700}},
	}, Ratios: map[string]float64{"pd3/local": 0.65, "pd3/sync": 3.25, "cpu:pd3/local": 2}}
	var b strings.Builder
	require.NoError(t, RenderReport(&b, map[string]SuiteRun{"page": {Suite: "page", Command: "pd3 bench page", Commit: "abc1234", Date: time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC), Report: rep}}))
	out := b.String()
	assert.Contains(t, out, "Not run yet: `pd3 bench report --run nbd`")
	assert.Contains(t, out, "**Run** 2026-11-27 at abc1234 on vm, 2 cpus")
	assert.Contains(t, out, "| dist=uniform | 1 000 (900–1 100) | 200 | 650 (600–700) |")
	assert.Contains(t, out, "Goals: 2 of 3 not met in this run.")
	// 0.65 against 0.7: the runs spread 0.2 + 0.15 around their medians.
	assert.Contains(t, out, "| `pd3/local` | ≥ 0.70 | 0.65 | **not met** (within the runs' spread, ±35 %) |")
	assert.Contains(t, out, "| `pd3/sync` | ≥ 1.65 | 3.25 | met |")
	assert.Contains(t, out, "| `cpu:pd3/local` | ≤ 1.25 | 2.00 | **not met** |")
	assert.Contains(t, out, "![Page server: random GETs over the page protocol](img/bench-page.png)")
}

func TestCellOfATimedRow(t *testing.T) {
	// A scan of 1 000 ms at 100 rows/s: the runs at 80 and 125 rows/s
	// took 1 250 and 800 ms.
	assert.Equal(t, "1 000 ms (800–1 250)", cell(Result{OpsPerSec: 100, Millis: 1000, RoundsOpsPerSec: []float64{80, 100, 125}}))
	assert.Equal(t, "2.50", group(2.5))
	assert.Equal(t, "12 345 678", group(12345678))
}

// The scale section: rows under load and rows of opening in a table each,
// the run's notes after them, and its goals read from the ratios.
func TestRenderScale(t *testing.T) {
	rep := &Report{Bench: "scale", Machine: "vm, 2 cpus", Results: []Result{
		{System: "pd3", Config: "nodes=1 randread-q32t1", OpsPerSec: 20000, P99us: 900, HostCPUusOp: 30, MemnodeCPUusOp: 12.5, EtcdReqPerSec: 2},
		{System: "pd3", Config: "volumes=1024", CreateMillis: 4100, OpenMillis: 2300, HostRSS: 80 << 20, MemnodeRSS: 42 << 20, MemnodeStored: 40 << 20, EtcdKeys: 2051, EtcdReqPerSec: 1.5, MapBytes: 120},
	}, Ratios: map[string]float64{"open_s:volumes=1024": 2.3}, Notes: []string{"volumes rows: fresh processes"}}
	var b strings.Builder
	require.NoError(t, RenderReport(&b, map[string]SuiteRun{"scale": {Suite: "scale", Command: "pd3 bench scale", Date: time.Now(), Report: rep}}))
	out := b.String()
	assert.Contains(t, out, "| nodes=1 randread-q32t1 | pd3 | 20 000 | 900 | 30.0 | 12.5 | 2.0 |")
	assert.Contains(t, out, "| volumes=1024 | 4 100 | 2 300 | 80 | 40 | 1.05 | 2 051 | 1.5 | 120 |")
	assert.Contains(t, out, "Volumes rows: fresh processes.")
	assert.Contains(t, out, "| seconds to reopen 1 024 volumes | `open_s:volumes=1024` | ≤ 5.00 | 2.30 | met |")
	assert.Contains(t, out, "| host RSS with a 16 GiB volume against 1 GiB, 1 GiB written to each | `host_rss:size=16GiB/size=1GiB` | ≤ 1.10 | – | not measured |")
}

// The size sweep's ratios that hold bytes written apart from volume size.
func TestScaleSizeRatios(t *testing.T) {
	rep := &Report{Ratios: map[string]float64{}, Results: []Result{
		{Config: "size=256MiB", HostRSS: 100, MemnodeRSS: 300, MemnodeStored: 256},
		{Config: "size=1GiB", HostRSS: 120, MemnodeRSS: 1070, MemnodeStored: 1024},
		{Config: "size=16GiB", HostRSS: 126, MemnodeRSS: 1071, MemnodeStored: 1024},
	}}
	scaleSizeRatios(rep)
	assert.InDelta(t, 1.05, rep.Ratios["host_rss:size=16GiB/size=1GiB"], 1e-9)
	assert.InDelta(t, 771.0/768, rep.Ratios["memnode_rss_added/stored_added:size=16GiB/size=256MiB"], 1e-9)
}

// TestCancelledSuiteIsAskedToStop: a suite whose run is cancelled gets
// SIGTERM, so that it can unmount and detach what it set up, not SIGKILL.
func TestCancelledSuiteIsAskedToStop(t *testing.T) {
	dir := t.TempDir()
	exe, asked := filepath.Join(dir, "suite"), filepath.Join(dir, "asked")
	script := "#!/bin/sh\ntrap 'touch " + asked + "; exit 1' TERM\necho started >&2\nwhile :; do sleep 0.05; done\n"
	require.NoError(t, os.WriteFile(exe, []byte(script), 0o755))
	ctx, cancel := context.WithCancel(context.Background())
	started := &firstWrite{ch: make(chan struct{})}
	done := make(chan SuiteRun, 1)
	go func() { done <- RunSuite(ctx, exe, Suite{Name: "s"}, filepath.Join(dir, "img.png"), started) }()
	<-started.ch // its trap is set
	cancel()
	run := <-done
	assert.NotEmpty(t, run.Err, "a cancelled suite failed")
	assert.FileExists(t, asked, "the suite was asked to stop")
}

// firstWrite closes ch at its first write.
type firstWrite struct {
	once sync.Once
	ch   chan struct{}
}

func (w *firstWrite) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.ch) })
	return len(p), nil
}

// A goal the cores may not allow is read against the ceiling in the same
// run where the ceiling is below it, and against itself where not.
func TestGoalOrTheCeiling(t *testing.T) {
	g := Goal{Ratio: "aggregate:pd3 hosts=4/hosts=1@r", Min: 3, OrCeiling: "aggregate:nbdkit-memory hosts=4/hosts=1@r", What: "4 hosts"}
	render := func(pd3, ceiling float64) string {
		rep := &Report{Ratios: map[string]float64{g.Ratio: pd3, g.OrCeiling: ceiling}}
		var b strings.Builder
		renderGoals(&b, rep, []Goal{g})
		return b.String()
	}
	assert.Contains(t, render(0.91, 0.88), "| ≥ 0.88, the ceiling (3.00 asked) | 0.91 | met |")
	assert.Contains(t, render(0.80, 0.88), "| ≥ 0.88, the ceiling (3.00 asked) | 0.80 | **not met** |")
	assert.Contains(t, render(2.5, 3.6), "| ≥ 3.00 | 2.50 | **not met** |")
	rep := &Report{Ratios: map[string]float64{g.Ratio: 3.2}} // no ceiling measured
	var b strings.Builder
	renderGoals(&b, rep, []Goal{g})
	assert.Contains(t, b.String(), "| ≥ 3.00 | 3.20 | met |")
}
