package bench

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape reads the pd3_* samples of a Prometheus text endpoint (parsed by
// prometheus/common/expfmt).
func scrape(ctx context.Context, url string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	out := map[string]float64{}
	for name, mf := range mfs {
		short, ok := strings.CutPrefix(name, "pd3_")
		if !ok || len(mf.GetMetric()) == 0 {
			continue
		}
		m := mf.GetMetric()[0] // pd3's metrics have no labels
		switch {
		case m.Counter != nil:
			out[short] = m.GetCounter().GetValue()
		case m.Gauge != nil:
			out[short] = m.GetGauge().GetValue()
		case m.Untyped != nil:
			out[short] = m.GetUntyped().GetValue()
		}
	}
	return out, nil
}

// delta subtracts counters (names ending in _total); gauges keep b's value.
func delta(a, b map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(b))
	for k, v := range b {
		if strings.HasSuffix(k, "_total") {
			out[k] = v - a[k]
		} else {
			out[k] = v
		}
	}
	return out
}
