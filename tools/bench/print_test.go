package bench

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The printed ratios say how wide their runs spread, and shout when the
// spread covers the difference a ratio reports.
func TestPrintSaysHowWideRunsSpread(t *testing.T) {
	rep := &Report{Bench: "nbd", Machine: "test", Results: []Result{
		{System: "pd3", Config: "noisy", OpsPerSec: 110, RoundsOpsPerSec: []float64{100, 110, 120}},
		{System: "nbdkit-memory", Config: "noisy", OpsPerSec: 100, RoundsOpsPerSec: []float64{90, 100, 130}},
		{System: "pd3", Config: "steady", OpsPerSec: 201, RoundsOpsPerSec: []float64{200, 201, 202}},
		{System: "nbdkit-memory", Config: "steady", OpsPerSec: 101, RoundsOpsPerSec: []float64{100, 101, 102}},
	}, Ratios: map[string]float64{
		"pd3/nbdkit-memory@noisy":  1.1,
		"pd3/nbdkit-memory@steady": 201.0 / 101,
		"memnode_rss/stored:pd3":   1.02,
	}}
	var b strings.Builder
	require.NoError(t, rep.Print(&b, false))
	out := b.String()
	lines := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "ratio" {
			lines[f[1]] = l
		}
	}
	assert.Contains(t, lines["pd3/nbdkit-memory@noisy"], "runs spread ±58 %: WITHIN THE SPREAD")
	assert.Contains(t, lines["pd3/nbdkit-memory@steady"], "runs spread ±3 %")
	assert.NotContains(t, lines["pd3/nbdkit-memory@steady"], "WITHIN")
	assert.NotContains(t, lines["memnode_rss/stored:pd3"], "spread", "a memory ratio has no runs")
	assert.NotContains(t, out, "warning: one run")

	// One run per system: the report says the ratios carry no spread.
	for i := range rep.Results {
		rep.Results[i].RoundsOpsPerSec = nil
	}
	b.Reset()
	require.NoError(t, rep.Print(&b, false))
	assert.Contains(t, b.String(), "warning: one run per system")
	// Unmeasured columns print "-", not a zero that reads as measured.
	assert.NotContains(t, b.String(), " 0.00 ")
}
