package bench

import (
	"context"
	"strings"

	"github.com/pd3-go/pd3/internal/scrape"
)

// scrapeValues reads the pd3_* samples of a /metrics endpoint by short
// name.
func scrapeValues(ctx context.Context, url string) (map[string]float64, error) {
	mfs, err := scrape.Families(ctx, url)
	if err != nil {
		return nil, err
	}
	return scrape.Values(mfs), nil
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
