package bench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// scrape reads the pd3_* samples of a Prometheus text endpoint.
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
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "pd3_") {
			continue
		}
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err == nil {
			out[strings.TrimPrefix(name, "pd3_")] = v
		}
	}
	return out, sc.Err()
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
