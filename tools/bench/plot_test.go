package bench

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkPNG decodes a plot and checks it is a drawing, not a blank canvas.
func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	b := img.Bounds()
	assert.GreaterOrEqual(t, b.Dx(), 800)
	assert.GreaterOrEqual(t, b.Dy(), 400)
	colours := map[[4]uint32]bool{}
	for y := b.Min.Y; y < b.Max.Y; y += 3 {
		for x := b.Min.X; x < b.Max.X; x += 3 {
			r, g, bl, a := img.At(x, y).RGBA()
			colours[[4]uint32{r, g, bl, a}] = true
		}
	}
	assert.Greater(t, len(colours), 8, "a blank canvas has one colour")
}

func TestPlot(t *testing.T) {
	dir := t.TempDir()
	bars := &Report{Bench: "nbd", Machine: "test", Results: []Result{
		{System: "pd3", Config: "randread-q1t1", OpsPerSec: 6615, P50us: 97, P99us: 490},
		{System: "nbdkit-memory", Config: "randread-q1t1", OpsPerSec: 19070, P50us: 48, P99us: 120},
		{System: "pd3", Config: "randread-q32t1", OpsPerSec: 23709, P50us: 1200, P99us: 3000},
		{System: "nbdkit-memory", Config: "randread-q32t1", OpsPerSec: 53156, P50us: 560, P99us: 900},
	}}
	require.NoError(t, bars.Plot(filepath.Join(dir, "bars.png")))
	checkPNG(t, filepath.Join(dir, "bars.png"))
	require.NoError(t, bars.Plot(filepath.Join(dir, "bars.svg")))
	svg, err := os.ReadFile(filepath.Join(dir, "bars.svg"))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(svg), "<?xml") || strings.Contains(string(svg), "<svg"))
	assert.Contains(t, string(svg), "nbdkit-memory")
	// Labels read as the printed ratio pd3/nbdkit-memory does (6615/19070),
	// not inverted; pd3's own bar carries its throughput, horizontally.
	assert.Contains(t, string(svg), ">0.35</text>")
	assert.Contains(t, string(svg), ">6.62k</text>")
	assert.Contains(t, string(svg), "on each bar pd3 ÷ that bar")
	assert.Contains(t, string(svg), "font-size:9px\">0.35")
	assert.NotContains(t, string(svg), ">25000.00<", "ticks in plain numbers")

	sweep := &Report{Bench: "page", Machine: "test", Results: []Result{
		{System: "pd3", Config: "dist=uniform T=CPUs lz=256KiB", OpsPerSec: 100},
		{System: "pd3", Config: "dist=uniform T=CPUs lz=1MiB", OpsPerSec: 150},
		{System: "pd3", Config: "dist=uniform T=CPUs lz=1MiB load=60/s", OpsPerSec: 60},
		{System: "pd3", Config: "dist=uniform T=CPUs lz=256KiB load=60/s", OpsPerSec: 60},
	}}
	sw, ok := sweepOf(sweep.Results)
	require.True(t, ok)
	assert.Equal(t, "lz", sw.name)
	assert.Equal(t, "dist=uniform T=CPUs load=60/s", sw.rest["dist=uniform T=CPUs lz=1MiB load=60/s"])
	require.NoError(t, sweep.Plot(filepath.Join(dir, "sweep.png")))
	checkPNG(t, filepath.Join(dir, "sweep.png"))
	assert.True(t, sw.sizes, "lz= is a size")
	counts, ok := sweepOf([]Result{{System: "a", Config: "threads=1"}, {System: "a", Config: "threads=16"}})
	require.True(t, ok)
	assert.False(t, counts.sizes, "threads= is a count, not MiB")
	assert.Equal(t, 16.0, counts.x["threads=16"])
	_, ok = sweepOf(bars.Results)
	assert.False(t, ok, "fio jobs are not a sweep")

	assert.ErrorContains(t, bars.Plot(filepath.Join(dir, "x.jpg")), "want a .png or .svg")
	assert.ErrorContains(t, (&Report{}).Plot(filepath.Join(dir, "x.png")), "no results")
}
