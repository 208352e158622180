// Package scrape reads a Prometheus text endpoint (a pd3 process's
// /metrics) for pd3's own tools: the benchmarks' per-system counters and
// pd3 top. Parsing is prometheus/common/expfmt's.
package scrape

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Families reads the metric families at url: http://HOST:PORT/metrics,
// or HOST:PORT for that.
func Families(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	if !strings.Contains(url, "://") {
		url = "http://" + url + "/metrics"
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil && strings.Contains(err.Error(), "malformed HTTP response") {
		what := "something other than HTTP"
		if strings.Contains(err.Error(), "NBDMAGIC") {
			what = "NBD"
		}
		return nil, fmt.Errorf("scraping %s: the address answers %s, not metrics: give the address the process's --metrics flag was given", url, what)
	}
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	return mfs, nil
}

// Sum is the total of family name's counters and gauges over all its
// label values (0 when absent): e.g. etcd's grpc_server_msg_received_total.
func Sum(mfs map[string]*dto.MetricFamily, name string) float64 {
	var n float64
	for _, m := range mfs[name].GetMetric() {
		n += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
	}
	return n
}

// Values returns the counters, gauges and untyped samples of the pd3_
// families by name without the prefix; a family with several series
// (labels) gives their sum.
func Values(mfs map[string]*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for name, mf := range mfs {
		short, ok := strings.CutPrefix(name, "pd3_")
		if !ok {
			continue
		}
		for _, m := range mf.GetMetric() {
			switch {
			case m.Counter != nil:
				out[short] += m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[short] += m.GetGauge().GetValue()
			case m.Untyped != nil:
				out[short] += m.GetUntyped().GetValue()
			}
		}
	}
	return out
}

// Buckets are a histogram's cumulative counts by upper bound.
type Buckets map[float64]uint64

// Histograms returns the histogram series of family name by the value of
// label (one entry per label value).
func Histograms(mfs map[string]*dto.MetricFamily, name, label string) map[string]Buckets {
	out := map[string]Buckets{}
	for _, m := range mfs[name].GetMetric() {
		h := m.GetHistogram()
		if h == nil {
			continue
		}
		key := ""
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				key = l.GetValue()
			}
		}
		b := Buckets{math.Inf(1): h.GetSampleCount()}
		for _, bk := range h.GetBucket() {
			b[bk.GetUpperBound()] = bk.GetCumulativeCount()
		}
		out[key] = b
	}
	return out
}

// Quantile estimates quantile q of the observations made between two
// scrapes of one histogram (before may be nil), interpolating linearly
// within a bucket as Prometheus's histogram_quantile does. ok is false
// when nothing was observed.
func Quantile(q float64, before, after Buckets) (v float64, ok bool) {
	bounds := make([]float64, 0, len(after))
	for ub := range after {
		bounds = append(bounds, ub)
	}
	sort.Float64s(bounds)
	count := func(ub float64) float64 { return float64(after[ub] - before[ub]) }
	if len(bounds) == 0 || count(bounds[len(bounds)-1]) == 0 {
		return 0, false
	}
	rank := q * count(bounds[len(bounds)-1])
	lower, below := 0.0, 0.0
	for _, ub := range bounds {
		c := count(ub)
		if c >= rank {
			if math.IsInf(ub, 1) {
				return lower, true // beyond the last bound: say the bound
			}
			if c == below {
				return ub, true
			}
			return lower + (ub-lower)*(rank-below)/(c-below), true
		}
		lower, below = ub, c
	}
	return lower, true
}
