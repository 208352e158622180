package bench

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// With rounds, the systems take turns in fresh processes (every round
// starts, fills and stops each system again) and each system's row of a
// job is its median run, so one slow run of one system moves neither
// its row nor a ratio.
func TestSuiteRoundsTakeTurnsAndReportMedians(t *testing.T) {
	// ops[sys][round] for the one job; round 2 of "a" is an outlier.
	ops := map[string][]float64{"a": {100, 104, 10}, "b": {50, 52, 48}}
	var order []string
	round := map[string]int{}
	rep := &Report{Ratios: map[string]float64{}}
	iops, err := runSuite(rep, nil, 3, []string{"a", "b"}, []string{"job", "skipped"}, func(sys string) (suiteSystem, error) {
		order = append(order, "start "+sys)
		n := round[sys]
		round[sys]++
		return suiteSystem{
			stop: func() { order = append(order, "stop "+sys) },
			fill: func() error { return nil },
			run: func(job string) (Result, error) {
				if job == "skipped" {
					return Result{}, errSkip
				}
				return Result{OpsPerSec: ops[sys][n], P50us: float64(n)}, nil
			},
		}, nil
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"start a", "stop a", "start b", "stop b", "start a", "stop a", "start b", "stop b", "start a", "stop a", "start b", "stop b"}, order)
	assert.Equal(t, map[string]map[string]float64{"a": {"job": 100}, "b": {"job": 50}}, iops)
	require.Len(t, rep.Results, 2)
	a := rep.Results[0]
	assert.Equal(t, "a", a.System)
	assert.Equal(t, 0.0, a.P50us, "the median run is reported whole")
	assert.Equal(t, []float64{10, 100, 104}, a.RoundsOpsPerSec)
	assert.Equal(t, "10–104", roundsRange(a))
	assert.Contains(t, fmt.Sprint(rep.Notes), "median run of 3")
}

// One round is the suite as it always ran: every run reported as it came.
func TestSuiteOneRoundReportsTheRun(t *testing.T) {
	rep := &Report{Ratios: map[string]float64{}}
	iops, err := runSuite(rep, nil, 1, []string{"a"}, []string{"job"}, func(string) (suiteSystem, error) {
		return suiteSystem{stop: func() {}, fill: func() error { return nil },
			run: func(string) (Result, error) { return Result{OpsPerSec: 7}, nil }}, nil
	})
	require.NoError(t, err)
	assert.Equal(t, 7.0, iops["a"]["job"])
	require.Len(t, rep.Results, 1)
	assert.Empty(t, rep.Results[0].RoundsOpsPerSec)
	assert.Equal(t, "-", roundsRange(rep.Results[0]))
	assert.Empty(t, rep.Notes)
}

func TestClusterSystemNames(t *testing.T) {
	for _, tc := range []struct {
		sys       string
		ok        bool
		placement []string
		nodes     int
		dpu       string
	}{
		{"pd3-r1", true, []string{"--replicas", "1"}, 2, "embedded"},
		{"pd3-r3", true, []string{"--replicas", "3"}, 3, "embedded"},
		{"pd3-r2-noagent", true, []string{"--replicas", "2"}, 2, "none"},
		{"pd3-ec4+2", true, []string{"--ec", "4+2"}, 6, "embedded"},
		{"pd3-ec2+1-noagent", true, []string{"--ec", "2+1"}, 3, "none"},
		{"pd3-ec4+2-down2", true, []string{"--ec", "4+2"}, 6, "embedded"},
		{"pd3-r2-down1", true, []string{"--replicas", "2"}, 2, "embedded"},
		{"pd3-ec4+2-down3", false, nil, 0, ""},
		{"pd3-r2-down2", false, nil, 0, ""},
		{"pd3-r3-n6", true, []string{"--replicas", "3"}, 6, "embedded"},
		{"pd3-ec4+2-n8-down1", true, []string{"--ec", "4+2"}, 8, "embedded"},
		{"pd3-r3-n0", false, nil, 0, ""},
		{"pd3-r3-nx", false, nil, 0, ""},
		{"pd3-r0", false, nil, 0, ""},
		{"pd3-ec4", false, nil, 0, ""},
		{"pd3-ec4+x", false, nil, 0, ""},
		{"pd3", false, nil, 0, ""},
	} {
		cs, ok := parseClusterSystem(tc.sys)
		require.Equal(t, tc.ok, ok, tc.sys)
		if ok {
			assert.Equal(t, tc.placement, cs.placement, tc.sys)
			assert.Equal(t, tc.nodes, cs.nodes, tc.sys)
			assert.Equal(t, tc.dpu, cs.dpu, tc.sys)
			if cs.down > 0 {
				assert.NotContains(t, cs.whole, "-down", tc.sys)
			}
		}
	}
}

// A system without a node (nil in its Nodes) measures as none.
func TestNodesSkipNil(t *testing.T) {
	n := Nodes{nil}
	assert.False(t, n.Any())
	assert.Zero(t, n.CPU())
	assert.Zero(t, n.RSS())
	assert.Zero(t, n.Stored(context.Background()))
}
