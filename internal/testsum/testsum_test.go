package testsum

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/testutil"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A stream as go test -json writes it: a package with a pass, a skip and a
// failed subtest, a package with no tests, a package that panicked.
const stream = `{"Action":"start","Package":"p/a"}
{"Action":"run","Package":"p/a","Test":"TestPass"}
{"Action":"output","Package":"p/a","Test":"TestPass","Output":"=== RUN   TestPass\n"}
{"Action":"output","Package":"p/a","Test":"TestPass","Output":"--- PASS: TestPass (0.00s)\n"}
{"Action":"pass","Package":"p/a","Test":"TestPass","Elapsed":0}
{"Action":"run","Package":"p/a","Test":"TestEtcd"}
{"Action":"output","Package":"p/a","Test":"TestEtcd","Output":"=== RUN   TestEtcd\n"}
{"Action":"output","Package":"p/a","Test":"TestEtcd","Output":"    etcd_test.go:12: etcd is not installed (make deps-system)\n"}
{"Action":"output","Package":"p/a","Test":"TestEtcd","Output":"--- SKIP: TestEtcd (0.00s)\n"}
{"Action":"skip","Package":"p/a","Test":"TestEtcd","Elapsed":0}
{"Action":"run","Package":"p/a","Test":"TestSub"}
{"Action":"run","Package":"p/a","Test":"TestSub/one"}
{"Action":"output","Package":"p/a","Test":"TestSub/one","Output":"    sub_test.go:9: got 1, want 2\n"}
{"Action":"fail","Package":"p/a","Test":"TestSub/one","Elapsed":0}
{"Action":"fail","Package":"p/a","Test":"TestSub","Elapsed":0}
{"Action":"output","Package":"p/a","Output":"FAIL\n"}
{"Action":"fail","Package":"p/a","Elapsed":1.5}
{"Action":"skip","Package":"p/empty"}
vet: not json
{"Action":"run","Package":"p/b","Test":"TestPanics"}
{"Action":"output","Package":"p/b","Test":"TestPanics","Output":"panic: boom\n"}
{"Action":"fail","Package":"p/b","Test":"TestPanics","Elapsed":0}
{"Action":"fail","Package":"p/b","Elapsed":0.2}
`

func TestReadCountsAndReplaysFailures(t *testing.T) {
	var w strings.Builder
	sum, err := Read(strings.NewReader(stream), &w)
	require.NoError(t, err)
	assert.Equal(t, Summary{
		Run: 5, Passed: 1, Failed: 3, Skipped: 1,
		FailedPackages: []string{"p/a", "p/b"},
		Skips:          []Skip{{Package: "p/a", Test: "TestEtcd", Reason: "etcd_test.go:12: etcd is not installed (make deps-system)"}},
	}, *sum)
	assert.Equal(t, "tests: 5 run, 1 passed, 3 failed, 1 skipped; 2 packages failed", sum.Line())
	out := w.String()
	assert.Contains(t, out, "got 1, want 2", "a failed test's output is shown")
	assert.Contains(t, out, "panic: boom")
	assert.NotContains(t, out, "=== RUN   TestPass", "a passed test's output is not")
	assert.Contains(t, out, "FAIL\tp/a\t1.500s")
	assert.Contains(t, out, "?   \tp/empty\t[no test files]")
	assert.Contains(t, out, "vet: not json", "lines that are not events pass through")
	assert.False(t, sum.OK(true))
}

func TestSkipsFailOnlyWhenRequired(t *testing.T) {
	var w strings.Builder
	sum, err := Read(strings.NewReader(strings.Join([]string{
		`{"Action":"run","Package":"p","Test":"T"}`,
		`{"Action":"skip","Package":"p","Test":"T"}`,
		`{"Action":"pass","Package":"p","Elapsed":0.1}`,
	}, "\n")), &w)
	require.NoError(t, err)
	assert.True(t, sum.OK(true))
	assert.False(t, sum.OK(false))
	assert.Equal(t, "(no reason given)", sum.Skips[0].Reason)
}

// At each tick the packages still running are named: a run is never
// silent for longer than a tick. A package that ended is not named.
func TestTicksNameThePackagesStillRunning(t *testing.T) {
	r, w := io.Pipe()
	var out testutil.SyncBuffer
	ticks := make(chan time.Time)
	done := make(chan *Summary)
	go func() {
		sum, err := ReadTicking(r, &out, ticks)
		assert.NoError(t, err)
		done <- sum
	}()
	_, err := io.WriteString(w, `{"Action":"start","Package":"p/slow"}`+"\n"+`{"Action":"start","Package":"p/quick"}`+"\n"+
		`{"Action":"pass","Package":"p/quick","Elapsed":0.1}`+"\n")
	require.NoError(t, err)
	// Each tick is taken by the reader between lines: tick until the
	// lines above are in.
	for !strings.Contains(out.String(), "ok  \tp/quick") {
		ticks <- time.Now()
	}
	ticks <- time.Now()
	ticks <- time.Now() // taken once the first one's line is written
	after := out.String()[strings.Index(out.String(), "ok  \tp/quick"):]
	assert.Regexp(t, `\.\.\. still running: p/slow \([0-9]+s\)\n`, after)
	_, err = io.WriteString(w, `{"Action":"pass","Package":"p/slow","Elapsed":61}`+"\n")
	require.NoError(t, err)
	require.NoError(t, w.Close())
	<-done
	all := out.String()
	assert.NotContains(t, all[strings.Index(all, "ok  \tp/quick"):], "p/quick (", "a package that passed is not named")
}
