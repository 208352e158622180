package bench

import (
	"cmp"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/pd3-go/pd3/internal/units"
)

// Plot draws r into path, a PNG or an SVG by its extension (gonum/plot):
// throughput per system in each configuration, each bar labelled with its
// ratio to the configuration's first system; where latency was measured,
// p99 per system with p50 written above; a sweep (configurations that
// differ in one NAME=SIZE, as bench page --sweep makes) as lines of
// throughput against the swept value.
func (r *Report) Plot(path string) error {
	ext := strings.ToLower(filepath.Ext(path))
	if ext != ".png" && ext != ".svg" {
		return fmt.Errorf("--plot %s: want a .png or .svg file", path)
	}
	if len(r.Results) == 0 {
		return fmt.Errorf("--plot %s: no results to draw", path)
	}
	var plots []*plot.Plot
	if sw, ok := sweepOf(r.Results); ok {
		p, err := sweepPlot(r, sw)
		if err != nil {
			return err
		}
		plots = append(plots, p)
	} else if r.Bench == "scale" {
		// The costs of a host as its volumes grow (the time to reopen
		// them, create above each bar; its memory), and the I/O rows'
		// throughput with the host CPU per operation above.
		costs, io := *r, *r
		costs.Results, io.Results = nil, nil
		for _, x := range r.Results {
			if x.CreateMillis > 0 {
				costs.Results = append(costs.Results, x)
			} else {
				io.Results = append(io.Results, x)
			}
		}
		if len(costs.Results) > 0 {
			p, err := barPlot(&costs, "reopen (ms); create above each bar", func(x Result) float64 { return x.OpenMillis },
				func(x, _ Result) string { return "create " + compact(x.CreateMillis) })
			if err != nil {
				return err
			}
			q, err := barPlot(&costs, "host RSS (MiB)", func(x Result) float64 { return mib(x.HostRSS) },
				func(x, _ Result) string { return strconv.FormatFloat(mib(x.HostRSS), 'f', 0, 64) })
			if err != nil {
				return err
			}
			plots = append(plots, p, q)
		}
		if len(io.Results) > 0 {
			p, err := barPlot(&io, "ops/s, all hosts; host CPU µs/op above", func(x Result) float64 { return x.OpsPerSec },
				func(x, _ Result) string { return strconv.FormatFloat(x.HostCPUusOp, 'f', 1, 64) })
			if err != nil {
				return err
			}
			plots = append(plots, p)
		}
	} else if r.Bench == "apps" {
		// Workloads differ by orders of magnitude (rows/s, tps, IOPS):
		// each bar is its system's throughput over the ceiling's
		// (nbdkit-memory under the same budget, or bindfs over tmpfs
		// where only filesystems ran), as PD3's Figure 18 normalises to
		// all-local.
		ceiling := map[string]float64{}
		for _, x := range r.Results {
			if x.System == "nbdkit-memory" || x.System == "bindfs" && ceiling[x.Config] == 0 {
				ceiling[x.Config] = x.OpsPerSec
			}
		}
		p, err := barPlot(r, "throughput / the ceiling (nbdkit-memory or bindfs, same budget)", func(x Result) float64 {
			if c := ceiling[x.Config]; c > 0 {
				return x.OpsPerSec / c
			}
			return 0
		}, func(x, _ Result) string {
			if c := ceiling[x.Config]; c > 0 {
				return strconv.FormatFloat(x.OpsPerSec/c, 'f', 2, 64)
			}
			return ""
		})
		if err != nil {
			return err
		}
		plots = append(plots, p)
	} else {
		ylabel := "throughput (ops/s)"
		if ref, ok := oneReference(r.Results); ok {
			// The labels read as the printed ratios do: REF/SYSTEM.
			ylabel = fmt.Sprintf("throughput (ops/s); on each bar %s ÷ that bar", ref)
		}
		p, err := barPlot(r, ylabel, func(x Result) float64 { return x.OpsPerSec }, ratioLabel)
		if err != nil {
			return err
		}
		plots = append(plots, p)
	}
	if r.Bench != "scale" && slices.ContainsFunc(r.Results, func(x Result) bool { return x.P99us > 0 }) {
		p, err := barPlot(r, "p99 latency (µs), p50 above", func(x Result) float64 { return x.P99us },
			func(x, _ Result) string { return "p50 " + strconv.FormatFloat(x.P50us, 'f', 0, 64) })
		if err != nil {
			return err
		}
		plots = append(plots, p)
	}
	plots[0].Title.Text = fmt.Sprintf("pd3 bench %s — %s", r.Bench, r.Machine)

	w, h := 10*vg.Inch, vg.Length(len(plots))*4.5*vg.Inch
	var c vg.CanvasSizer
	var write func(*os.File) error
	if ext == ".png" {
		img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(96))
		c = img
		write = func(f *os.File) error { _, err := vgimg.PngCanvas{Canvas: img}.WriteTo(f); return err }
	} else {
		svg := vgsvg.New(w, h)
		c = svg
		write = func(f *os.File) error { _, err := svg.WriteTo(f); return err }
	}
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter}
	grid := make([][]*plot.Plot, len(plots))
	for i, p := range plots {
		grid[i] = []*plot.Plot{p}
	}
	canvases := plot.Align(grid, tiles, dc)
	for i, p := range plots {
		p.Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("--plot %s: %w", path, err)
	}
	return f.Close()
}

// ratioLabel labels the first system measured in a configuration (pd3,
// the system the ratios are of) with its throughput, and every other bar
// with FIRST/THIS, in the direction of the ratios the report prints
// (pd3/nbdkit-memory 1.18 is 1.18 above the nbdkit-memory bar).
func ratioLabel(x, first Result) string {
	if first.OpsPerSec == 0 || x.OpsPerSec == 0 || x.System == first.System {
		return compact(x.OpsPerSec)
	}
	return strconv.FormatFloat(first.OpsPerSec/x.OpsPerSec, 'f', 2, 64)
}

// compactTicks are gonum's default ticks in plain numbers (25k, 2.5k,
// not 25000.00).
type compactTicks struct{}

// Ticks implements plot.Ticker.
func (compactTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label == "" || hi < 10 {
			continue
		}
		v, suffix := siScale(ts[i].Value)
		ts[i].Label = strconv.FormatFloat(v, 'f', -1, 64) + suffix
	}
	return ts
}

// oneReference is the system measured first in every configuration, if
// it is the same one throughout.
func oneReference(rs []Result) (string, bool) {
	first := map[string]string{}
	var ref string
	for _, x := range rs {
		if _, seen := first[x.Config]; !seen {
			first[x.Config] = x.System
			if ref != "" && ref != x.System {
				return "", false
			}
			ref = x.System
		}
	}
	return ref, ref != ""
}

// siScale is v in thousands or millions where it reaches them, and
// the suffix that says so.
func siScale(v float64) (float64, string) {
	switch {
	case v >= 1e6:
		return v / 1e6, "M"
	case v >= 1e3:
		return v / 1e3, "k"
	}
	return v, ""
}

// compact prints a rate in three digits: 812, 52.1k, 1.20M.
func compact(v float64) string {
	v, suffix := siScale(v)
	switch {
	case suffix == "":
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 100:
		return fmt.Sprintf("%.0f%s", v, suffix)
	case v >= 10:
		return fmt.Sprintf("%.1f%s", v, suffix)
	}
	return fmt.Sprintf("%.2f%s", v, suffix)
}

// barPlot groups results by configuration (x) with a bar per system.
func barPlot(r *Report, ylabel string, val func(Result) float64, label func(x, first Result) string) (*plot.Plot, error) {
	var configs, systems []string
	for _, x := range r.Results {
		if !slices.Contains(configs, x.Config) {
			configs = append(configs, x.Config)
		}
		if !slices.Contains(systems, x.System) {
			systems = append(systems, x.System)
		}
	}
	p := plot.New()
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	p.Y.Tick.Marker = compactTicks{}
	p.Legend.Top = true
	p.NominalX(configs...)
	// The bars take up to 180 mm of the 10-inch chart, at most 12 mm each.
	barW := min(12*vg.Millimeter, 180*vg.Millimeter/vg.Length(max(1, len(configs)*len(systems))))
	for i, sys := range systems {
		vals := make(plotter.Values, len(configs))
		var xys plotter.XYs
		var labels []string
		for j, cfg := range configs {
			var first *Result
			for k := range r.Results {
				x := r.Results[k]
				if x.Config != cfg {
					continue
				}
				if first == nil {
					first = &r.Results[k]
				}
				if x.System == sys {
					vals[j] = val(x)
					xys = append(xys, plotter.XY{X: float64(j), Y: val(x)})
					labels = append(labels, label(x, *first))
				}
			}
		}
		bars, err := plotter.NewBarChart(vals, barW)
		if err != nil {
			return nil, err
		}
		bars.Color = plotutil.Color(i)
		bars.LineStyle.Width = 0
		bars.Offset = barW * vg.Length(2*i-len(systems)+1) / 2
		p.Add(bars)
		p.Legend.Add(sys, bars)
		if len(xys) > 0 {
			l, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
			if err != nil {
				return nil, err
			}
			for k := range l.TextStyle {
				ts := &l.TextStyle[k]
				ts.Font.Size = 9
				ts.Color = color.Black
				if ts.Width(labels[k]) <= barW*1.15 {
					ts.XAlign, ts.YAlign = draw.XCenter, draw.YBottom
					continue
				}
				// Wider than its bar: vertical, so neighbours do not overlap.
				ts.Rotation = 1.5708
				ts.XAlign, ts.YAlign = draw.XLeft, draw.YCenter
			}
			l.Offset = vg.Point{X: bars.Offset, Y: vg.Millimeter}
			p.Add(l)
		}
	}
	// Room above the tallest bar for its label, and for the legend.
	p.Y.Max *= 1.3 + 0.06*float64(len(systems))
	return p, nil
}

// sweep is a set of configurations that differ in one NAME=SIZE field.
type sweep struct {
	name  string
	x     map[string]float64 // config → swept value
	rest  map[string]string  // config → the config without the field
	sizes bool               // the values are sizes (lz=1MiB), not counts (threads=4)
}

// sweepOf finds a sweep: a NAME=SIZE field every configuration has, with
// at least two values (the other fields, such as load=, stay in the
// line's name).
func sweepOf(rs []Result) (sweep, bool) {
	for _, f := range strings.Fields(rs[0].Config) {
		name, _, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		sw := sweep{name: name, x: map[string]float64{}, rest: map[string]string{}}
		values := map[float64]bool{}
		all := true
		for _, x := range rs {
			var rest []string
			found := false
			for _, g := range strings.Fields(x.Config) {
				k, v, _ := strings.Cut(g, "=")
				if k != name {
					rest = append(rest, g)
					continue
				}
				n, err := units.ParseSize(v)
				if err != nil {
					break
				}
				if _, err := strconv.ParseUint(v, 10, 64); err != nil {
					sw.sizes = true
				}
				sw.x[x.Config], found = float64(n), true
				values[float64(n)] = true
			}
			if !found {
				all = false
				break
			}
			sw.rest[x.Config] = strings.Join(rest, " ")
		}
		if all && len(values) > 1 {
			return sw, true
		}
	}
	return sweep{}, false
}

// sweepPlot draws throughput against the swept value, a line per system
// (and per remaining configuration, if more than one).
func sweepPlot(r *Report, sw sweep) (*plot.Plot, error) {
	p := plot.New()
	label, scale := sw.name, 1.0
	if sw.sizes {
		label, scale = sw.name+" (MiB)", 1<<20
	}
	p.X.Label.Text = label
	p.Y.Label.Text = "throughput (ops/s)"
	p.Y.Min = 0
	p.Legend.Top = true
	type key struct{ sys, rest string }
	var keys []key
	lines := map[key]plotter.XYs{}
	rests := map[string]bool{}
	for _, x := range r.Results {
		k := key{x.System, sw.rest[x.Config]}
		if _, ok := lines[k]; !ok {
			keys = append(keys, k)
		}
		lines[k] = append(lines[k], plotter.XY{X: sw.x[x.Config] / scale, Y: x.OpsPerSec})
		rests[k.rest] = true
	}
	for i, k := range keys {
		xys := lines[k]
		slices.SortFunc(xys, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, err
		}
		l.Color, pts.Color = plotutil.Color(i), plotutil.Color(i)
		pts.Shape = plotutil.Shape(i)
		p.Add(l, pts)
		name := k.sys
		if len(rests) > 1 {
			name += " " + k.rest
		}
		p.Legend.Add(name, l, pts)
	}
	return p, nil
}
