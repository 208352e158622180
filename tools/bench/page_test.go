package bench

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A system's reported run is its median by throughput, kept whole (its
// latency and CPU come from the same run), whatever order the runs came in.
func TestMedianRunKeepsTheMiddleRunWhole(t *testing.T) {
	run := func(ops, p99 float64) Result { return Result{OpsPerSec: ops, P99us: p99} }
	for _, tc := range []struct {
		name string
		runs []Result
		want Result
	}{
		{"one", []Result{run(5, 1)}, run(5, 1)},
		{"odd", []Result{run(9, 1), run(3, 2), run(6, 3)}, withRounds(run(6, 3), 3, 6, 9)},
		{"even takes the lower middle", []Result{run(4, 1), run(8, 2), run(2, 3), run(6, 4)}, withRounds(run(4, 1), 2, 4, 6, 8)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, medianRun(tc.runs))
		})
	}
}

func withRounds(r Result, ops ...float64) Result {
	r.RoundsOpsPerSec = ops
	return r
}
