package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"image/color"
	"image/png"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/internal/linearize"
	"github.com/pd3-go/pd3/internal/nbdclient"
	"github.com/pd3-go/pd3/internal/sched"
	"github.com/pd3-go/pd3/internal/scrape"
	"github.com/pd3-go/pd3/internal/testetcd"
	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/pd3-go/pd3/internal/tlsfiles"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore/pageproto"
	"github.com/pd3-go/pd3/tools/bench"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

var pd3Bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pd3-bin-")
	if err != nil {
		panic(err)
	}
	pd3Bin = filepath.Join(dir, "pd3")
	out, err := exec.Command("go", "build", "-o", pd3Bin, ".").CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		panic("building pd3: " + err.Error() + "\n" + string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func start(t *testing.T, want []string, args ...string) *bench.Child {
	t.Helper()
	c, err := bench.StartChild(context.Background(), pd3Bin, want, args...)
	require.NoError(t, err)
	t.Cleanup(c.Stop)
	return c
}

func run(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, pd3Bin, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String() + errb.String(), err
	}
	return out.String(), nil
}

func TestUpServesAndStopsCleanly(t *testing.T) {
	up := start(t, []string{"memory node", "page server"}, "up", "--page", "127.0.0.1:0", "--nbd", "", "--volume", "disk0:64MiB", "--cache", "1MiB", "--mount", "", "--procs", "3", "--writeback", "0")
	addr := up.Addrs["page server"]
	// Workers default to the process's GOMAXPROCS (set by --procs: the
	// test's own may differ, e.g. under go test -cpu 1).
	assert.Contains(t, up.Output(), "workers 3")
	assert.Eventually(t, func() bool { return strings.Contains(up.Output(), "try: echo hello | "+pd3Bin+" page put") },
		10*time.Second, 10*time.Millisecond, "the suggested command names the binary as invoked")
	_, err := run(t, "hello pd3", "page", "put", "--page", addr, "1:7")
	require.NoError(t, err)
	out, err := run(t, "", "page", "get", "--page", addr, "1:7")
	require.NoError(t, err)
	assert.Len(t, out, 4096)
	assert.True(t, strings.HasPrefix(out, "hello pd3\x00"))
	_, err = run(t, "", "page", "sync", "--page", addr)
	require.NoError(t, err)

	out, err = run(t, "", "page", "get", "--page", addr, "1:999999")
	require.Error(t, err)
	assert.Contains(t, out, "page out of range: volume 1 (disk0) has 16384 pages, 1:0 to 1:16383")
	out, err = run(t, "", "page", "get", "--page", addr, "9:0")
	require.Error(t, err)
	assert.Contains(t, out, "no such volume: this server serves volumes 1 (disk0, 16384 pages)")
	_, err = run(t, "hello", "page", "put", "--page", addr, "1:8")
	require.NoError(t, err)

	// SIGINT: a clean exit with status 0, page 1:8 written back on the way
	// (background write-back is off).
	p, err := os.FindProcess(up.Pid)
	require.NoError(t, err)
	require.NoError(t, p.Signal(syscall.SIGINT))
	done := make(chan error, 1)
	go func() { _, err := p.Wait(); done <- err }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("pd3 up did not stop on SIGINT")
	}
	require.NoError(t, up.WaitOutput("stopped:", 5*time.Second))
	assert.Contains(t, up.Output(), "stopping: writing back 1 dirty pages (4KiB) to the memory node")
	assert.Contains(t, up.Output(), "stopped: 1 pages (4KiB) written back")
}

// TestUsageErrors: wrong input is refused with what the user needs to fix
// it, in the one log format.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"frob"}, []string{`pd3: error: unknown command "frob" for "pd3"`, "pd3: run 'pd3 --help' for usage"}},
		{[]string{"up", "--frob"}, []string{"pd3: error: unknown flag: --frob", "pd3: run 'pd3 up --help' for usage"}},
		{[]string{"page", "get"}, []string{"accepts 1 arg(s), received 0", "run 'pd3 page get --help'"}},
		// Sizes are parsed with the flags: a bad one is a usage error
		// before anything starts.
		{[]string{"up", "--volume", "d:1000", "--mount", ""}, []string{`invalid argument "d:1000" for "--volume" flag`, `size "1000" (1000 bytes) is not a whole number of 4KiB pages: use 4KiB`, "run 'pd3 up --help'"}},
		{[]string{"up", "--cache", "10001", "--mount", ""}, []string{`for "--cache" flag`, "use 8KiB or 12KiB", "run 'pd3 up --help'"}},
		{[]string{"up", "--volume", "d:1PB", "--mount", ""}, []string{`bad size "1PB"`, "1G = 1GB = 1GiB", "run 'pd3 up --help'"}},
		{[]string{"bench", "nbd", "--size", "1000"}, []string{`for "--size" flag`, "run 'pd3 bench nbd --help'"}},
		{[]string{"memnode", "--capacity", "12345"}, []string{`for "--capacity" flag`, "run 'pd3 memnode --help'"}},
		{[]string{"page", "get", "--page", "127.0.0.1:1", "1:0"}, []string{"pd3: error: pageproto: dialling 127.0.0.1:1"}},
		{[]string{"up", "--memnodes", "3", "--memnode", "127.0.0.1:1"}, []string{"--memnodes starts embedded memory nodes: it does not go with --memnode", "run 'pd3 up --help'"}},
		{[]string{"up", "--memnodes", "3", "--memnode-listen", "127.0.0.1:7100"}, []string{"--memnode-listen: 3 embedded memory nodes (--memnodes) cannot share 127.0.0.1:7100: leave the port to the system (:0)", "run 'pd3 up --help'"}},
		{[]string{"up", "--memnodes", "3", "--replicas", "0"}, []string{"--replicas: 3 embedded memory nodes (--memnodes) serve replicated volumes: set it", "run 'pd3 up --help'"}},
		{[]string{"up", "--memnodes", "3", "--etcd-listen", "none"}, []string{"--etcd-listen: none turns the embedded etcd off", "leave it on or set --etcd", "run 'pd3 up --help'"}},
		{[]string{"serve", "--replicas", "2"}, []string{"--replicas places volumes through the control plane: give --etcd URLS", "run 'pd3 serve --help'"}},
		{[]string{"serve", "--ec", "4+2"}, []string{"--ec places volumes through the control plane: give --etcd URLS", "run 'pd3 serve --help'"}},
		{[]string{"serve", "--ec", "4"}, []string{`erasure code "4": want K+M, data and parity shards, e.g. 4+2`, "run 'pd3 serve --help'"}},
		{[]string{"serve", "--ec", "0+2"}, []string{"erasure code 0+2: want 1 to 32 data shards and 1 to 8 parity shards", "run 'pd3 serve --help'"}},
		{[]string{"volume", "create", "v", "--size", "1GiB", "--ec", "4+2", "--replicas", "2", "--etcd", "http://127.0.0.1:1"}, []string{"--replicas and --ec are two ways to survive lost nodes: give one", "run 'pd3 volume create --help'"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, err := run(t, "", tc.args...)
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, out, w)
			}
			if !strings.Contains(strings.Join(tc.want, ""), "--help") {
				assert.NotContains(t, out, "--help", "only usage errors point at --help")
			}
		})
	}
}

func TestServeReopensVolumesAtTheNode(t *testing.T) {
	node := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0", "--token", "s3cret",
		"--grant", "tenant=t1.*,pd3.leases,pd3.epochs")
	args := []string{"serve", "--memnode", node.Addrs["memory node"], "--token", "s3cret", "--page", "127.0.0.1:0", "--nbd", "", "--volume", "disk0:16MiB", "--volume", "logs:4MiB"}
	host := start(t, []string{"page server"}, args...)
	_, err := run(t, "persisted at the node", "page", "put", "--page", host.Addrs["page server"], "2:3")
	require.NoError(t, err)
	host.Stop() // SIGTERM writes dirty pages back

	host = start(t, []string{"page server"}, args...)
	out, err := run(t, "", "page", "get", "--page", host.Addrs["page server"], "2:3")
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(out, "persisted at the node\x00"))

	out, err = run(t, "", "serve", "--memnode", node.Addrs["memory node"], "--token", "wrong", "--page", "127.0.0.1:0", "--nbd", "")
	require.Error(t, err)
	assert.Contains(t, out, "unauthorised")

	// A granted token serves its volumes and is refused the others.
	out, err = run(t, "", "serve", "--memnode", node.Addrs["memory node"], "--token", "tenant", "--page", "127.0.0.1:0", "--nbd", "", "--volume", "disk0:16MiB")
	require.Error(t, err)
	assert.Contains(t, out, `volume "disk0"`)
	assert.Contains(t, out, "outside this connection's grant")
	tenant := start(t, []string{"page server"}, "serve", "--memnode", node.Addrs["memory node"], "--token", "tenant",
		"--page", "127.0.0.1:0", "--nbd", "", "--volume", "t1.disk:4MiB")
	// Volume ids are the node's, so the tenant's id depends on what exists.
	m := regexp.MustCompile(`volume t1\.disk id (\d+)`).FindStringSubmatch(tenant.Output())
	require.NotNil(t, m, tenant.Output())
	out, err = run(t, "the tenant's page", "page", "put", "--page", tenant.Addrs["page server"], m[1]+":1")
	require.NoError(t, err, out)
	out, err = run(t, "", "page", "get", "--page", tenant.Addrs["page server"], m[1]+":1")
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(out, "the tenant's page\x00"))
}

func TestBadFlagsSayWhy(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	taken := busy.Addr().String()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"up", "--cache", "banana"}, `invalid argument "banana" for "--cache" flag: bad size`},
		{[]string{"up", "--volume", "disk0"}, "want NAME:SIZE"},
		{[]string{"serve"}, "--memnode ADDR or --etcd URLS is required"},
		{[]string{"memnode", "--grant", "tenant"}, "want TOKEN=PATTERN"},
		{[]string{"memnode", "--grant", "tenant=[x"}, "bad pattern"},
		{[]string{"page", "get", "nope"}, "want VOLUME:PAGE"},
		{[]string{"page", "get", "1:281474976710656"}, "past the last a volume can have, 281474976710655"},
		{[]string{"up", "--policy", "random"}, "unknown eviction policy"},
		{[]string{"up", "--mirror", "pcap"}, `invalid argument "pcap" for "--mirror" flag: unknown mirror "pcap": tap, packet or none`},
		// Fields that contradict each other, refused before anything
		// starts (no "listening" line) and said in flags, not fields.
		{[]string{"up", "--prefetch", "leap"}, "--prefetch: leap is a host-side prefetcher: set --dpu to none"},
		{[]string{"serve", "--memnode", "127.0.0.1:1", "--dpu", "none", "--mirror", "packet"}, "--mirror: packet feeds an agent: set --dpu to embedded or shm:NAME"},
		{[]string{"serve", "--memnode", "127.0.0.1:1", "--tls", "require"}, "--tls: require needs --tls-certificates"},
		{[]string{"dpu", "--memnode", "127.0.0.1:1", "--packet", "http=127.0.0.1:80"}, "neither page nor nbd"},
		// A port in use, before etcd and the memory node start.
		{[]string{"up", "--mount", "", "--nbd", taken}, "--nbd " + taken + ": the address is in use (another pd3 or server listens there): choose another with --nbd HOST:PORT, or --nbd '' for none"},
		{[]string{"up", "--mount", "", "--nbd", "", "--page", taken}, "--page " + taken + ": the address is in use"},
		{[]string{"serve", "--memnode", "127.0.0.1:1", "--nbd", "", "--metrics", taken}, "--metrics " + taken + ": the address is in use"},
		{[]string{"bench", "page", "--arrivals", "bursty"}, "neither poisson nor uniform"},
	} {
		out, err := run(t, "", tc.args...)
		assert.Error(t, err, tc.args)
		assert.Contains(t, out, tc.want, tc.args)
		assert.NotContains(t, out, "listening", tc.args)
	}
}

// TestBenchSmoke runs both benchmarks briefly: they must produce their JSON
// shape with ratios; the numbers themselves are not judged here.
func TestBenchSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several processes")
	}
	t.Parallel() // with the other smoke runs, once the serial tests are done
	out, err := run(t, "", "bench", "transport", "--duration", "200ms", "--rounds", "2", "--json")
	require.NoError(t, err, out)
	var rep bench.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	assert.Contains(t, rep.Ratios, "memnode/raw")
	assert.Contains(t, rep.Ratios, "raw-random-zc/raw", "the ceiling of a server of random pages, side by side")
	assert.Contains(t, rep.Ratios, "memnode/rr-random-zc", "the ceiling of a server asked for every page, side by side")
	assert.Contains(t, rep.Ratios, "memnode-fn/rr-random-zc", "the client with no caller to wake, side by side")
	assert.Contains(t, rep.Ratios, "tls/plain", "the memory-node link over mutual TLS, side by side")
	assert.Contains(t, rep.Ratios, "tls/plain_ceiling")
	if assert.Contains(t, rep.Ratios, "memnode_private/stored") {
		assert.Less(t, rep.Ratios["memnode_private/stored"], rep.Ratios["memnode_rss/stored"], "the node's own memory, without its binary's text")
	}
	systems := map[string]bool{}
	for _, r := range rep.Results {
		systems[r.System] = true
		assert.Positive(t, r.OpsPerSec, "%s %s", r.System, r.Config)
	}
	assert.Equal(t, map[string]bool{"memnode": true, "raw": true, "raw-random": true, "raw-random-zc": true, "rr-random-zc": true, "memnode-mtls": true, "aes-gcm": true}, systems)
	assert.Len(t, rep.Results, 11, "one row per system and configuration, whatever the rounds")
	for _, r := range rep.Results[:6] {
		assert.Len(t, r.RoundsOpsPerSec, 2, "%s %s: the median of both rounds, with each round's rate", r.System, r.Config)
	}

	out, err = run(t, "", "bench", "page", "--dataset", "16MiB", "--cache", "1MiB", "--duration", "300ms", "--warmup", "100ms", "--dist", "uniform,zipf:0.99", "--json")
	require.NoError(t, err, out)
	rep = bench.Report{}
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	assert.Len(t, rep.Results, 8, "4 systems × 2 distributions")
	assert.Contains(t, rep.Ratios, "pd3/sync@dist=zipf:0.99 T=CPUs")
	for _, r := range rep.Results {
		assert.Zero(t, r.Errors)
		assert.Positive(t, r.OpsPerSec)
	}

	// The ceilings: relay-local does no page server's work, sync-deep
	// does a miss's with a worker per request in flight.
	out, err = run(t, "", "bench", "page", "--dataset", "16MiB", "--cache", "1MiB", "--duration", "300ms", "--warmup", "100ms",
		"--systems", "local,relay-local,sync-deep", "--clients", "2", "--depth", "3", "--json")
	require.NoError(t, err, out)
	rep = bench.Report{}
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	for _, k := range []string{"relay-local/local", "sync-deep/local", "cpu:relay-local/local", "cpu:sync-deep/local"} {
		assert.Contains(t, rep.Ratios, k)
	}
	assert.Contains(t, rep.Notes, "sync-deep = sync with 6 workers, one per request in flight, whatever T says")
	for _, r := range rep.Results {
		assert.Zero(t, r.Errors)
		assert.Positive(t, r.OpsPerSec)
	}

	out, err = run(t, "", "bench", "page", "--dataset", "16MiB", "--cache", "1MiB", "--duration", "300ms", "--warmup", "100ms",
		"--systems", "local,sync,pd3-split,pd3-split-packet", "--fixed-load", "0.5", "--sweep", "lz=256KiB,1MiB", "--json")
	require.NoError(t, err, out)
	rep = bench.Report{}
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	assert.Len(t, rep.Results, 16, "4 systems × 2 sweep values × (closed + fixed load)")
	for _, k := range []string{"cpu:pd3/local", "p99:pd3/local", "p99:pd3/sync"} {
		assert.Contains(t, rep.Ratios, k+"@dist=uniform T=CPUs lz=1MiB")
	}
	for _, r := range rep.Results {
		assert.Zero(t, r.Errors)
		if strings.HasPrefix(r.System, "pd3-split") {
			assert.Positive(t, r.AgentCPUusOp, "agent CPU is measured apart")
		}
		if strings.Contains(r.Config, "load=") {
			assert.Positive(t, r.SendDelayP99us, "open-loop rows report the generator's send delay")
		} else {
			assert.Zero(t, r.SendDelayP99us, "closed-loop rows have no schedule")
		}
	}
}

// TestSplitAgentKilledMidRun runs memory node, a pd3 dpu agent process and
// pd3 serve --dpu shm:NAME; clients do GET/PUT/SYNC on a small, constantly
// evicted working set while the agent is SIGKILLed and restarted twice.
// Clients must see no error and the history must be linearizable.
func TestSplitAgentKilledMidRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several processes")
	}
	name := fmt.Sprintf("test%d", os.Getpid())
	node := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0")
	agentArgs := []string{"dpu", "--memnode", node.Addrs["memory node"], "--shm", name, "--lz", "256KiB", "--cache", "64KiB"}
	agent := start(t, []string{"dpu agent"}, agentArgs...)
	host := start(t, []string{"page server", "metrics"}, "serve", "--memnode", node.Addrs["memory node"], "--dpu", "shm:"+name,
		"--page", "127.0.0.1:0", "--nbd", "", "--volume", "disk0:1MiB", "--cache", "64KiB", "--workers", "4", "--metrics", "127.0.0.1:0")

	ctx := context.Background()
	hist := linearize.NewHistory()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := pageproto.Dial(ctx, host.Addrs["page server"], pageproto.ClientOptions{})
			if !assert.NoError(t, err) {
				return
			}
			defer cl.Close()
			assert.NoError(t, hist.Run(c, linearize.PageClient{C: cl, Vol: 1}, 48, 77, stop, 0), "client-visible error while the agent churns")
		}()
	}
	// The link's counters say when the host has attached to an agent and
	// when it has found it dead: each kill hits an attached agent, and the
	// ops after it run on the path the test means.
	linkAt := func(name string, n int) {
		t.Helper()
		require.Eventually(t, func() bool {
			mfs, err := scrape.Families(ctx, host.Addrs["metrics"])
			return err == nil && scrape.Sum(mfs, name) >= float64(n)
		}, 30*time.Second, 10*time.Millisecond, "waiting for %s to reach %d", name, n)
	}
	for round := 0; round < 2; round++ {
		linkAt("pd3_link_attaches_total", round+1)
		waitOps(t, hist, 300) // through the agent
		p, _ := os.FindProcess(agent.Pid)
		require.NoError(t, p.Signal(syscall.SIGKILL))
		linkAt("pd3_link_agent_deaths_total", round+1)
		waitOps(t, hist, 300) // the host went direct
		agent = start(t, []string{"dpu agent"}, agentArgs...)
	}
	linkAt("pd3_link_attaches_total", 3)
	waitOps(t, hist, 300)
	close(stop)
	wg.Wait()
	require.Greater(t, hist.Len(), 1000)
	ok, vis := hist.Check(time.Minute)
	require.True(t, ok, "history of %d operations is not linearizable (see %s)", hist.Len(), vis)

	out, err := http.Get(host.Addrs["metrics"])
	require.NoError(t, err)
	body, _ := io.ReadAll(out.Body)
	out.Body.Close()
	m := string(body)
	assert.Contains(t, m, "pd3_link_agent_deaths_total 2")
	assert.Contains(t, m, "pd3_link_attaches_total 3")
	assert.Contains(t, m, "pd3_link_attached 1")
	assert.Regexp(t, `pd3_cache_loadingzone_hits_total [1-9]`, m, "the agent's Loading Zone served misses")
	assert.Regexp(t, `pd3_link_agent_writes_total [1-9]`, m, "write-backs went through the agent")
	t.Logf("%d operations linearizable across 2 agent kills", hist.Len())
}

// TestBenchNBDSmoke: the NBD benchmark runs every system and job end to
// end (fio verifies nothing here; the numbers are not judged).
func TestBenchNBDSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several processes")
	}
	t.Parallel() // with the other smoke runs, once the serial tests are done
	for _, tool := range []string{"fio", "nbdkit"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (make deps-system)", tool)
		}
	}
	plotPath := filepath.Join(t.TempDir(), "nbd.png")
	out, err := run(t, "", "bench", "nbd", "--size", "64MiB", "--cache", "4MiB", "--runtime", "1s", "--ramp", "0s",
		"--jobs", "randread-q32t1,randwrite-q32t1", "--json", "--plot", plotPath)
	require.NoError(t, err, out)
	// The chart is a real PNG of a plausible size with a drawing on it.
	f, err := os.Open(plotPath)
	require.NoError(t, err)
	img, err := png.Decode(f)
	f.Close()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, img.Bounds().Dx(), 800)
	assert.GreaterOrEqual(t, img.Bounds().Dy(), 800, "throughput and latency panels")
	colours := map[color.Color]bool{}
	for y := 0; y < img.Bounds().Dy(); y += 4 {
		for x := 0; x < img.Bounds().Dx(); x += 4 {
			colours[img.At(x, y)] = true
		}
	}
	assert.Greater(t, len(colours), 8, "not a blank canvas")
	var rep bench.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	assert.Len(t, rep.Results, 12) // pd3, nbdkit-memory, two nbdkit cache chains, pd3-local, the relay ceiling
	assert.Contains(t, rep.Ratios, "pd3/nbdkit-memory@randread-q32t1")
	assert.Contains(t, rep.Ratios, "pd3/nbdkit-cache-nbd@randread-q32t1")
	assert.Contains(t, rep.Ratios, "pd3/nbdkit-readahead-cache-nbd@randwrite-q32t1")
	assert.Contains(t, rep.Ratios, "pd3-local/nbdkit-memory@randread-q32t1")
	assert.Contains(t, rep.Ratios, "pd3/go-relay-nbdkit-memory@randread-q32t1")
	assert.Contains(t, rep.Ratios, "go-relay-nbdkit-memory/nbdkit-cache-nbd@randread-q32t1")
	// CPU time comes from /proc in 10 ms ticks, and on a loaded machine a
	// remote may use less than one tick in a 1 s job; summed over the jobs
	// it is measured at all, which is what this smoke test checks.
	remoteCPU := map[string]float64{}
	for _, r := range rep.Results {
		assert.Positive(t, r.OpsPerSec, r.System+" "+r.Config)
		remoteCPU[r.System] += r.MemnodeCPUusOp
		if r.System == "pd3" {
			// From the node's /metrics: the 64 MiB fill is stored there.
			assert.GreaterOrEqual(t, r.MemnodeStored, uint64(64<<20), "pd3 %s: bytes stored at the memory node", r.Config)
		}
	}
	for _, sys := range []string{"pd3", "nbdkit-cache-nbd", "go-relay-nbdkit-memory"} {
		assert.Positive(t, remoteCPU[sys], "the remote process's CPU is measured for %s", sys)
	}
	idle := 0
	for _, n := range rep.Notes {
		if strings.Contains(n, "idle for") {
			idle++
		}
	}
	assert.Equal(t, 6, idle, "every system's idle CPU is reported: %v", rep.Notes)
}

// TestBenchNBDBreakdownSmoke: the per-stage breakdown stamps every stage
// of a pd3 miss and a pd3 hit across the client, host and memory-node
// processes (the numbers are not judged).
func TestBenchNBDBreakdownSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several processes")
	}
	t.Parallel() // with the other smoke runs, once the serial tests are done
	for _, tool := range []string{"fio", "nbdkit"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (make deps-system)", tool)
		}
	}
	out, err := run(t, "", "bench", "nbd", "--size", "64MiB", "--cache", "4MiB", "--breakdown", "300", "--json")
	require.NoError(t, err, out)
	var bd bench.Breakdown
	require.NoError(t, json.Unmarshal([]byte(out), &bd))
	rows := map[string]bench.BreakdownRow{}
	for _, r := range bd.Rows {
		rows[r.System] = r
	}
	require.Contains(t, rows, "pd3")
	require.Contains(t, rows, "pd3-local")
	require.Contains(t, rows, "nbdkit-nbd")
	for _, floor := range []string{"go-crossing", "go-crossing-poll", "go-relay", "go-relay-two-threads", "go-relay-poll-outstanding", "go-relay-poll-servers", "go-relay-poll"} {
		require.Contains(t, rows, floor)
		assert.Equal(t, 300, rows[floor].Requests, floor)
	}
	assert.Len(t, rows["pd3"].Stages, 9, "every stage of a miss")
	assert.Len(t, rows["pd3-local"].Stages, 4, "every stage of a hit")
	assert.Greater(t, rows["pd3"].Requests, 100, "most reads of a 4 MiB cache over 64 MiB miss")
	for _, r := range bd.Rows {
		assert.Positive(t, r.P50us, r.System)
		for _, s := range r.Stages {
			assert.GreaterOrEqual(t, s.P50us, 0.0, r.System+" "+s.Stage)
		}
	}
	assert.Equal(t, []string{"host", "memory node"}, []string{rows["pd3"].CPU[0].Process, rows["pd3"].CPU[1].Process})

	// Reads of 128 KiB: pd3's streams, end to end, with each process's CPU.
	out, err = run(t, "", "bench", "nbd", "--size", "64MiB", "--cache", "4MiB", "--breakdown", "100", "--breakdown-bytes", "128KiB", "--json")
	require.NoError(t, err, out)
	bd = bench.Breakdown{}
	require.NoError(t, json.Unmarshal([]byte(out), &bd))
	var systems []string
	var cpu float64
	for _, r := range bd.Rows {
		systems = append(systems, r.System)
		assert.Equal(t, 100, r.Requests, r.System)
		assert.Positive(t, r.P50us, r.System)
		assert.Empty(t, r.Stages, r.System)
		require.NotEmpty(t, r.CPU, r.System)
		for _, c := range r.CPU {
			// A process's CPU time comes in clock ticks (10 ms): 100
			// short reads may take less than one.
			assert.GreaterOrEqual(t, c.PerReadUs, 0.0, r.System+" "+c.Process)
			cpu += c.PerReadUs
		}
	}
	assert.Positive(t, cpu, "the processes' CPU is measured")
	assert.Equal(t, []string{"pd3", "pd3-local", "nbdkit-memory", "nbdkit-nbd", "nbdkit-cache-nbd"}, systems)
	out, err = run(t, "", "bench", "nbd", "--breakdown", "10", "--breakdown-bytes", "64MiB", "--size", "32MiB")
	require.Error(t, err)
	assert.Contains(t, out, "a breakdown read of 67108864 bytes: a multiple of 4 KiB up to 32 MiB and the export's size")
}

// TestBenchFUSESmoke: the FUSE benchmark mounts, lays out, measures and
// unmounts each system (the numbers are not judged).
func TestBenchFUSESmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several processes")
	}
	t.Parallel() // with the other smoke runs, once the serial tests are done
	if os.Geteuid() != 0 {
		t.Skip("needs root (mounts, drop_caches)")
	}
	if err := fs.Available(); err != nil {
		t.Skip(err)
	}
	systems := "pd3,pd3-cached,tmpfs"
	if _, err := exec.LookPath("nbdfuse"); err == nil {
		systems += ",nbdfuse-nbdkit"
	}
	if _, err := exec.LookPath("nbdkit"); err == nil {
		systems += ",go-fuse-nbdkit"
	}
	testutil.LockPageCache(t) // the benchmark drops the page cache
	out, err := run(t, "", "bench", "fuse", "--size", "32MiB", "--cache", "4MiB", "--runtime", "1s",
		"--systems", systems, "--jobs", "randread-psync-1-direct,seqread1m-psync-1-buffered", "--json")
	require.NoError(t, err, out)
	var rep bench.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	assert.Len(t, rep.Results, 2*len(strings.Split(systems, ",")))
	assert.Contains(t, rep.Ratios, "pd3/pd3-cached@randread-psync-1-direct")
	for _, r := range rep.Results {
		assert.Positive(t, r.OpsPerSec, r.System+" "+r.Config)
		if r.System == "pd3" {
			assert.Positive(t, r.MemnodeCPUusOp, "the memory node's CPU is measured")
		}
	}
}

// TestPersistentMemnodeSurvivesSIGKILL: writers keep writing through a
// persistent memory node that is SIGKILLed at random moments and
// restarted, 10 rounds; after each restart every acknowledged write reads
// back exactly (later writes of the same page may have replaced it).
func TestPersistentMemnodeSurvivesSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	dir := t.TempDir()
	ctx := context.Background()
	// A fixed port so clients redial the same address after each restart.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	startNode := func() *bench.Child {
		return start(t, []string{"memory node"}, "memnode", "--listen", addr, "--persist", dir)
	}
	node := startNode()
	c, err := memnode.Dial(ctx, addr, memnode.ClientOptions{OpTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer c.Close()
	v, err := c.Create(ctx, "vol", 4<<20)
	require.NoError(t, err)
	const pages = 1024
	// acked[p] is the last version acknowledged for page p; inflight[p]
	// is a version sent but not acknowledged (it may or may not survive).
	var mu sync.Mutex
	acked := make([]uint64, pages)
	inflight := make([]uint64, pages)
	page := func(p, ver uint64) []byte {
		b := make([]byte, 4096)
		binary.LittleEndian.PutUint64(b, p)
		binary.LittleEndian.PutUint64(b[8:], ver)
		return b
	}
	rng := rand.New(rand.NewPCG(7, 8))
	var ver uint64
	for round := 0; round < 10; round++ {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					p := uint64(w + 4*((i*7919)%(pages/4)))
					mu.Lock()
					ver++
					myVer := ver
					inflight[p] = myVer
					mu.Unlock()
					if err := c.WriteAt(ctx, v.ID, p*4096, page(p, myVer)); err != nil {
						return // the node died under us
					}
					mu.Lock()
					if myVer > acked[p] {
						acked[p] = myVer
					}
					mu.Unlock()
				}
			}()
		}
		// When the node dies is what this test varies: a sleep is the point.
		time.Sleep(time.Duration(50+rng.IntN(300)) * time.Millisecond)
		p, _ := os.FindProcess(node.Pid)
		require.NoError(t, p.Signal(syscall.SIGKILL))
		close(stop)
		wg.Wait()
		node = startNode()
		buf := make([]byte, 4096)
		n := 0
		for pg := uint64(0); pg < pages; pg++ {
			mu.Lock()
			want, maybe := acked[pg], inflight[pg]
			mu.Unlock()
			if want == 0 {
				continue
			}
			require.NoError(t, c.ReadAt(ctx, v.ID, pg*4096, buf))
			got := binary.LittleEndian.Uint64(buf[8:])
			require.True(t, got == want || (got > want && got <= maybe),
				"round %d: page %d has version %d, acknowledged %d (in flight %d)", round, pg, got, want, maybe)
			require.Equal(t, pg, binary.LittleEndian.Uint64(buf), "page %d holds another page", pg)
			n++
		}
		t.Logf("round %d: %d acknowledged pages verified after SIGKILL", round, n)
	}
	node.Stop()
	assert.Contains(t, node.Output(), "memory node stopping: 1 volume, 4MiB of memory")
	assert.Contains(t, node.Output(), "memory node stopped: its volumes are on disk in "+dir+"; start it again with the same --persist")
}

// TestFrozenMemnodeGivesEIO: with the memory node stopped (SIGSTOP), NBD
// reads that miss the host cache fail with EIO within the configured
// operation timeout instead of hanging; after SIGCONT they succeed again
// and no acknowledged (flushed) write is lost.
func TestFrozenMemnodeGivesEIO(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	if _, err := exec.LookPath("qemu-io"); err != nil {
		t.Skip("qemu-io is not installed (make deps-system)")
	}
	node := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0")
	host := start(t, []string{"NBD server"}, "serve", "--memnode", node.Addrs["memory node"], "--volume", "disk0:64MiB",
		"--cache", "256KiB", "--nbd", "127.0.0.1:0", "--page", "", "--dpu", "none", "--op-timeout", "1s")
	uri := "nbd://" + host.Addrs["NBD server"] + "/disk0"
	qemu := func(cmds ...string) (string, error) { return qemuIO(uri, nil, cmds...) }
	out, err := qemu("write -P 0x42 0 4M", "flush")
	require.NoError(t, err, out)

	p, err := os.FindProcess(node.Pid)
	require.NoError(t, err)
	require.NoError(t, p.Signal(syscall.SIGSTOP))
	stopped := true
	t.Cleanup(func() {
		if stopped {
			p.Signal(syscall.SIGCONT)
		}
	})
	startT := time.Now()
	out, _ = qemu("read -P 0x42 32M 64k") // far from the cached pages
	took := time.Since(startT)
	assert.Contains(t, out, "Input/output error", "a frozen memory node is an I/O error")
	assert.Less(t, took, 15*time.Second, "bounded by --op-timeout, not a hang (took %v)", took)

	require.NoError(t, p.Signal(syscall.SIGCONT))
	stopped = false
	out, err = qemu("read -P 0x42 0 4M", "read -P 0 32M 64k")
	require.NoError(t, err, out)
	assert.False(t, qemuFailed(out), "service resumes and the flushed data is intact: %s", out)
}

// qemuIO runs qemu-io with options opts on uri, one -c per command, and
// returns its output.
func qemuIO(uri string, opts []string, cmds ...string) (string, error) {
	args := append(append([]string{"-f", "raw"}, opts...), uri)
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "qemu-io", args...).CombinedOutput()
	return string(out), err
}

// qemuFailed reports whether qemu-io's output shows a failed command: it
// exits 0 after "Pattern verification failed" or an I/O error.
func qemuFailed(out string) bool {
	o := strings.ToLower(out)
	return strings.Contains(o, "failed") || strings.Contains(o, "error")
}

// TestHostKilledKeepsFlushedData: pd3 serve is SIGKILLed during a stream
// of write+FLUSH rounds; restarted on the same memory node, it serves every
// round whose FLUSH was acknowledged.
func TestHostKilledKeepsFlushedData(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	if _, err := exec.LookPath("qemu-io"); err != nil {
		t.Skip("qemu-io is not installed (make deps-system)")
	}
	node := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nbdAddr := ln.Addr().String()
	ln.Close()
	// The restarted host waits out the killed one's volume lease.
	args := []string{"serve", "--memnode", node.Addrs["memory node"], "--volume", "disk0:64MiB",
		"--cache", "16MiB", "--nbd", nbdAddr, "--page", "", "--volume-lease", "1s"}
	host := start(t, []string{"NBD server"}, args...)
	uri := "nbd://" + nbdAddr + "/disk0"
	qemu := func(cmds ...string) error {
		out, err := qemuIO(uri, []string{"--cache=writeback"}, cmds...) // no FUA: only FLUSH makes writes durable
		if err == nil && qemuFailed(out) {
			err = fmt.Errorf("%s", out)
		}
		return err
	}
	const region = 64 << 10
	var flushed atomic.Int64 // rounds [0, flushed) were acknowledged by FLUSH
	done := make(chan struct{})
	go func() {
		defer close(done)
		for r := 0; r < 1000; r++ {
			off := r * region
			if qemu(fmt.Sprintf("write -P %d %d %d", r%250+1, off, region), "flush") != nil {
				return // the host died
			}
			flushed.Store(int64(r + 1))
		}
	}()
	require.Eventually(t, func() bool { return flushed.Load() >= 3 }, 30*time.Second, 5*time.Millisecond, "rounds flushed before the kill")
	p, _ := os.FindProcess(host.Pid)
	require.NoError(t, p.Signal(syscall.SIGKILL))
	<-done
	n := int(flushed.Load())
	require.Positive(t, n, "some rounds completed before the kill")

	start(t, []string{"NBD server"}, args...)
	for r := 0; r < n; r++ {
		require.NoError(t, qemu(fmt.Sprintf("read -P %d %d %d", r%250+1, r*region, region)), "round %d was flushed before the kill", r)
	}
	t.Logf("%d flushed rounds intact after SIGKILL of the host", n)
}

// TestSplitAgentKilledUnderNBDMultiConn: four NBD connections read and
// write a small, constantly evicted set of pages through pd3 serve --dpu
// shm:NAME while the agent process is SIGKILLed and restarted twice; no
// client sees an error and porcupine finds the whole history (≥ 10 000
// operations) linearizable.
func TestSplitAgentKilledUnderNBDMultiConn(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several processes")
	}
	name := fmt.Sprintf("nbdtest%d", os.Getpid())
	node := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0")
	agentArgs := []string{"dpu", "--memnode", node.Addrs["memory node"], "--shm", name, "--lz", "256KiB", "--cache", "64KiB"}
	agent := start(t, []string{"dpu agent"}, agentArgs...)
	host := start(t, []string{"NBD server", "metrics"}, "serve", "--memnode", node.Addrs["memory node"], "--dpu", "shm:"+name,
		"--nbd", "127.0.0.1:0", "--page", "", "--volume", "disk0:1MiB", "--cache", "64KiB", "--workers", "4", "--metrics", "127.0.0.1:0")

	hist := linearize.NewHistory()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := nbdclient.Dial(host.Addrs["NBD server"], "disk0")
			if !assert.NoError(t, err) {
				return
			}
			defer cl.Close()
			assert.NoError(t, hist.Run(c, linearize.NBDClient{C: cl}, 48, 91, stop, 0), "client-visible error while the agent churns")
		}()
	}
	for round := 0; round < 2; round++ {
		waitOps(t, hist, 1000) // through the agent
		p, _ := os.FindProcess(agent.Pid)
		require.NoError(t, p.Signal(syscall.SIGKILL))
		waitOps(t, hist, 500) // the host went direct
		agent = start(t, []string{"dpu agent"}, agentArgs...)
	}
	waitOps(t, hist, max(0, 10000-hist.Len()))
	close(stop)
	wg.Wait()
	require.GreaterOrEqual(t, hist.Len(), 10000)
	ok, vis := hist.Check(2 * time.Minute)
	require.True(t, ok, "history of %d NBD operations is not linearizable (see %s)", hist.Len(), vis)
	resp, err := http.Get(host.Addrs["metrics"])
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := string(body)
	assert.Contains(t, m, "pd3_link_agent_deaths_total 2")
	assert.Regexp(t, `pd3_cache_loadingzone_hits_total [1-9]`, m, "the agent prefetched NBD reads")
	t.Logf("%d NBD operations over 4 connections linearizable across 2 agent kills", hist.Len())
}

func mounted(dir string) bool {
	b, _ := os.ReadFile("/proc/self/mounts")
	return strings.Contains(string(b), " "+dir+" ")
}

// TestMountStopsCleanlyAndPersists: `pd3 mount` on a persistent embedded
// node, stopped with SIGTERM, leaves no mount behind, and a second run
// shows the same files.
func TestMountStopsCleanlyAndPersists(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root here")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	dir := t.TempDir()
	mnt, persist := filepath.Join(dir, "mnt"), filepath.Join(dir, "node")
	data := bytes.Repeat([]byte("remote memory "), 50_000)
	for round := range 2 {
		m := start(t, []string{"memory node"}, "mount", mnt, "--persist", persist, "--cache", "1MiB")
		require.Eventually(t, func() bool { return strings.Contains(m.Output(), "mounted at") }, 10*time.Second, 10*time.Millisecond)
		t.Cleanup(func() {
			if mounted(mnt) {
				syscall.Unmount(mnt, syscall.MNT_DETACH)
			}
		})
		if round == 0 {
			require.NoError(t, os.MkdirAll(mnt+"/a/b", 0o755))
			require.NoError(t, os.WriteFile(mnt+"/a/b/data", data, 0o644))
		} else {
			got, err := os.ReadFile(mnt + "/a/b/data")
			require.NoError(t, err)
			assert.True(t, bytes.Equal(data, got), "file differs after restart")
		}
		m.Stop()
		assert.False(t, mounted(mnt), "still mounted after SIGTERM")
		assert.Contains(t, m.Output(), "stopping")
	}
	out, err := run(t, "", "mount")
	require.Error(t, err)
	assert.Contains(t, out, "accepts 1 arg")
}

// TestCachestat: cachestat reports a file read through a pd3 mount with
// its reads, misses and cached pages.
func TestCachestat(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for the mount and eBPF")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	testutil.LockPageCache(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	m := start(t, []string{"memory node"}, "mount", mnt, "--cache", "1MiB")
	require.Eventually(t, func() bool { return strings.Contains(m.Output(), "mounted at") }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, os.WriteFile(mnt+"/data", bytes.Repeat([]byte{7}, 1<<20), 0o644))
	testutil.DropCaches(t)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, pd3Bin, "cachestat", mnt, "--count", "1", "--interval", "1500ms")
	var out testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "tracing the page cache") }, 10*time.Second, 5*time.Millisecond, "%s", out.String())
	for range 3 {
		_, err := os.ReadFile(mnt + "/data")
		require.NoError(t, err)
	}
	require.NoError(t, cmd.Wait(), "%s", out.String())
	var row []string
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) == 7 && f[6] == "data" {
			row = f
		}
	}
	require.NotNil(t, row, "%s", out.String())
	// READ MISSES HIT% CACHED PAGES CACHED% FILE
	reads, _ := strconv.Atoi(row[0])
	misses, _ := strconv.Atoi(row[1])
	// This VM's kernel reclaims page cache eagerly (buff/cache stays near
	// 60 MiB of 24 GiB), so a page or two may be gone by the report.
	cached, _ := strconv.Atoi(row[3])
	assert.GreaterOrEqual(t, cached, 240, "the pages read are cached: %s", out.String())
	assert.Equal(t, "256", row[4])
	assert.GreaterOrEqual(t, misses, 256, "the first read missed every page: %s", out.String())
	assert.LessOrEqual(t, misses, reads, "%s", out.String())
	assert.GreaterOrEqual(t, reads, 3*256, "three reads of 256 pages: %s", out.String())
	assert.LessOrEqual(t, reads, 3*260, "each read counted once, not once per batch of pages: %s", out.String())
}

// TestMountHostKilledKeepsFsynced: a `pd3 mount` host SIGKILLed mid-run
// (its memory node, a separate process, lives on) loses nothing that was
// fsynced: a new host on the same node shows the fsynced files whole.
func TestMountHostKilledKeepsFsynced(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root here")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	node := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0")
	mnt := filepath.Join(t.TempDir(), "mnt")
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	rng := rand.New(rand.NewPCG(testutil.Seed(t), 3))
	want := map[string][]byte{}
	for round := range 3 {
		host := start(t, nil, "mount", mnt, "--memnode", node.Addrs["memory node"], "--cache", "1MiB", "--fs-lease", "1s", "--volume-lease", "1s")
		require.Eventually(t, func() bool { return strings.Contains(host.Output(), "mounted at") }, 10*time.Second, 10*time.Millisecond)
		for name, data := range want {
			got, err := os.ReadFile(filepath.Join(mnt, name))
			require.NoError(t, err, "round %d", round)
			require.True(t, bytes.Equal(data, got), "round %d: %s differs", round, name)
		}
		for i := range 5 {
			name := fmt.Sprintf("r%d-f%d", round, i)
			data := make([]byte, 1+rng.IntN(3<<20))
			for j := range data {
				data[j] = byte(rng.Uint32())
			}
			f, err := os.Create(filepath.Join(mnt, name))
			require.NoError(t, err)
			_, err = f.Write(data)
			require.NoError(t, err)
			require.NoError(t, f.Sync())
			require.NoError(t, f.Close())
			want[name] = data
		}
		// Unsynced work in flight when the host dies.
		require.NoError(t, os.WriteFile(filepath.Join(mnt, fmt.Sprintf("r%d-unsynced", round)), make([]byte, 1<<20), 0o644))
		require.NoError(t, syscall.Kill(host.Pid, syscall.SIGKILL))
		host.Stop() // reaps it
		require.NoError(t, syscall.Unmount(mnt, syscall.MNT_DETACH), "the dead mount")
	}
}

// TestMountHostKilledKeepsATree: tar x of 10,000 small files and cp -r
// of this repository onto a `pd3 mount`, every file fsynced, the host
// SIGKILLed: a new host's mount matches both (diff -r).
func TestMountHostKilledKeepsATree(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root here")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	if testing.Short() {
		t.Skip("10,000 files")
	}
	src := t.TempDir()
	tree := testutil.SmallFiles(t, src, 10000)
	repo, err := filepath.Abs("../..")
	require.NoError(t, err)
	sh := func(name string, args ...string) {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		require.NoError(t, err, "%s %v: %s", name, args, out)
	}
	sh("tar", "-C", src, "-cf", src+"/tree.tar", "tree")

	node := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0")
	mnt := filepath.Join(t.TempDir(), "mnt")
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	mount := func() *bench.Child {
		host := start(t, nil, "mount", mnt, "--memnode", node.Addrs["memory node"], "--fs-lease", "1s", "--volume-lease", "1s")
		require.Eventually(t, func() bool { return strings.Contains(host.Output(), "mounted at") }, 10*time.Second, 10*time.Millisecond)
		return host
	}
	host := mount()
	sh("tar", "-C", mnt, "-xf", src+"/tree.tar")
	sh("cp", "-r", repo, mnt+"/repo")
	testutil.FsyncTree(t, mnt+"/tree")
	testutil.FsyncTree(t, mnt+"/repo")
	require.NoError(t, syscall.Kill(host.Pid, syscall.SIGKILL))
	host.Stop() // reaps it
	require.NoError(t, syscall.Unmount(mnt, syscall.MNT_DETACH), "the dead mount")

	mount()
	sh("diff", "-r", tree, mnt+"/tree")
	sh("diff", "-r", repo, mnt+"/repo")
}

// damageLogTail appends what a crash mid-write can leave after the last
// durable entry of the newest log segment: random bytes, a truncated copy
// of an entry, or a whole entry with one bit flipped. Recovery must stop
// there and lose nothing acknowledged.
func damageLogTail(t *testing.T, dir string, rng *rand.Rand) string {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "log-*.wal"))
	require.NoError(t, err)
	require.NotEmpty(t, segs)
	newest := segs[len(segs)-1] // zero-padded generations sort
	first := make([]byte, 48+4096)
	src, _ := filepath.Glob(filepath.Join(dir, "log-*.wal"))
	for _, s := range src {
		if b, err := os.ReadFile(s); err == nil && len(b) >= len(first) {
			copy(first, b)
			break
		}
	}
	var tail []byte
	kind := []string{"garbage", "truncated", "bit-flipped"}[rng.IntN(3)]
	switch kind {
	case "garbage":
		tail = make([]byte, 1+rng.IntN(8192))
		for i := range tail {
			tail[i] = byte(rng.Uint32())
		}
	case "truncated":
		tail = append([]byte(nil), first[:1+rng.IntN(len(first)-1)]...)
	case "bit-flipped":
		tail = append([]byte(nil), first...)
		bit := rng.IntN(len(tail) * 8)
		tail[bit/8] ^= 1 << (bit % 8)
	}
	f, err := os.OpenFile(newest, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.Write(tail)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	return fmt.Sprintf("%s tail of %d bytes on %s", kind, len(tail), filepath.Base(newest))
}

// TestFioOverNBDSurvivesMemnodeCrashes: fio writes crc32c-verified blocks
// (each block once: a lost write reads as zeroes, a bad magic header)
// over NBD (a FLUSH every 16 writes) while the persistent memory node is
// SIGKILLed at random moments and its log tail damaged, 10 rounds. The
// host retries write-backs across each restart; at the end it stops
// cleanly, the node is killed once more, and a fresh host verifies every
// block fio saw acknowledged in every round.
func TestFioOverNBDSurvivesMemnodeCrashes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("fio is not installed (make deps-system)")
	}
	dir := t.TempDir()
	nodeDir := filepath.Join(dir, "node")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	startNode := func() *bench.Child {
		return start(t, []string{"memory node"}, "memnode", "--listen", addr, "--persist", nodeDir)
	}
	node := startNode()
	startHost := func() *bench.Child {
		return start(t, []string{"NBD server"}, "serve", "--memnode", addr, "--volume", "disk0:128MiB", "--cache", "2MiB",
			"--nbd", "127.0.0.1:0", "--page", "", "--mount", "", "--op-timeout", "10s", "--writeback", "100ms")
	}
	host := startHost()
	rng := rand.New(rand.NewPCG(testutil.Seed(t), 11))
	const rounds, region = 10, 8 << 20
	fio := func(uri string, round int, verify bool) (string, error) {
		args := []string{"--name=r" + strconv.Itoa(round), "--ioengine=nbd", "--uri=" + uri, "--rw=randwrite", "--bs=4k",
			"--offset=" + strconv.Itoa(round*region), "--size=" + strconv.Itoa(region), "--iodepth=8", "--fsync=16",
			"--verify=crc32c", "--verify_fatal=1", "--randseed=" + strconv.Itoa(1000+round)}
		if verify {
			args = append(args, "--verify_only")
			if _, err := os.Stat(filepath.Join(dir, "local-r"+strconv.Itoa(round)+"-0-verify.state")); err == nil {
				args = append(args, "--verify_state_load=1")
			}
		} else {
			args = append(args, "--do_verify=0", "--verify_state_save=1")
		}
		return fioIn(dir, args...)
	}
	for round := range rounds {
		uri := "nbd://" + host.Addrs["NBD server"] + "/disk0"
		done := make(chan error, 1)
		var out string
		go func() {
			var err error
			out, err = fio(uri, round, false)
			done <- err
		}()
		// When the node dies, and for how long, is what this test varies:
		// sleeps are the point.
		time.Sleep(time.Duration(20+rng.IntN(200)) * time.Millisecond)
		require.NoError(t, syscall.Kill(node.Pid, syscall.SIGKILL))
		node.Stop()
		what := damageLogTail(t, nodeDir, rng)
		time.Sleep(time.Duration(200+rng.IntN(600)) * time.Millisecond) // down for a while
		node = startNode()
		err := <-done
		t.Logf("round %d: node killed, %s; fio: %v", round, what, err)
		require.NoError(t, err, "a node restart inside --op-timeout is invisible to clients: %s", out)
	}
	host.Stop() // SIGTERM: everything written back
	require.NoError(t, syscall.Kill(node.Pid, syscall.SIGKILL))
	node.Stop()
	t.Log("final: " + damageLogTail(t, nodeDir, rng))
	node = startNode()
	host = startHost()
	uri := "nbd://" + host.Addrs["NBD server"] + "/disk0"
	for round := range rounds {
		out, err := fio(uri, round, true)
		require.NoError(t, err, "round %d: %s", round, out)
		require.NotContains(t, out, "verify: bad", "round %d", round)
	}
}

// fioIn runs fio in dir (where it keeps its verify state), bounded to two
// minutes, and returns what it printed.
func fioIn(dir string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "fio", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// vethNS is a network namespace joined to the root one by a veth pair:
// rootIP on the root side (rootSide), nsIP inside. Taking rootSide down
// partitions the two without resetting connections. Removed in cleanup.
type vethNS struct {
	t            *testing.T
	ns, rootSide string
	rootIP, nsIP string
	ipMu         sync.Mutex
}

func newVethNS(t *testing.T) *vethNS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	id := strconv.Itoa(os.Getpid()%10000) + strconv.Itoa(int(vethSeq.Add(1)))
	sub := strconv.Itoa(16 + (os.Getpid()+int(vethSeq.Load())*37)%200)
	v := &vethNS{t: t, ns: "pd3t" + id, rootSide: "pd3h" + id, rootIP: "10.231." + sub + ".1", nsIP: "10.231." + sub + ".2"}
	nsSide := "pd3n" + id
	v.ip("netns", "add", v.ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", v.ns).Run() }) // takes the veth with it
	v.ip("link", "add", v.rootSide, "type", "veth", "peer", "name", nsSide)
	t.Cleanup(func() { exec.Command("ip", "link", "del", v.rootSide).Run() })
	v.ip("link", "set", nsSide, "netns", v.ns)
	v.ip("addr", "add", v.rootIP+"/30", "dev", v.rootSide)
	v.ip("link", "set", v.rootSide, "up")
	v.ip("netns", "exec", v.ns, "ip", "addr", "add", v.nsIP+"/30", "dev", nsSide)
	v.ip("netns", "exec", v.ns, "ip", "link", "set", nsSide, "up")
	v.ip("netns", "exec", v.ns, "ip", "link", "set", "lo", "up")
	return v
}

// vethSeq tells apart the namespaces of one test process.
var vethSeq atomic.Int32

func (v *vethNS) ip(args ...string) {
	v.t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	require.NoError(v.t, err, "ip %v: %s", args, out)
}

// Cut takes the link down until the returned heal (also run in cleanup).
func (v *vethNS) Cut() (heal func()) {
	v.ip("link", "set", v.rootSide, "down")
	var once sync.Once
	heal = func() { once.Do(func() { exec.Command("ip", "link", "set", v.rootSide, "up").Run() }) }
	v.t.Cleanup(heal)
	return heal
}

// Shared returns an address of the root namespace that processes inside
// the namespace reach through the veth (so that Cut partitions them from
// it) and processes of the root namespace reach on loopback (so that Cut
// does not): a /32 on lo, removed in cleanup.
func (v *vethNS) Shared() string {
	v.t.Helper()
	addr := strings.Replace(v.rootIP, "10.231.", "10.232.", 1)
	v.ip("addr", "add", addr+"/32", "dev", "lo")
	v.t.Cleanup(func() { exec.Command("ip", "addr", "del", addr+"/32", "dev", "lo").Run() })
	v.ip("netns", "exec", v.ns, "ip", "route", "add", addr+"/32", "via", v.rootIP)
	return addr
}

// TestReplicatedHandOverDuringPartition: a host serving a volume with two
// replicas is cut off (its own network namespace, the link taken down)
// with a write in its cache that its write-back is sending; a second host
// takes the volume over once the first one's hold in etcd runs out, reads
// what the first one flushed, and writes. When the link comes back the
// first host's late write-back reaches both replicas and both refuse it:
// each replica holds the new owner's data.
func TestReplicatedHandOverDuringPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	vn := newVethNS(t)
	shared := vn.Shared()
	ports := testetcd.FreePorts(t, 3)
	etcd := fmt.Sprintf("http://%s:%d", shared, ports[0])
	start(t, []string{"etcd"}, "coord", "--listen", fmt.Sprintf("%s:%d", shared, ports[0]), "--dir", t.TempDir())
	var nodeAddrs []string
	for _, p := range ports[1:] {
		addr := fmt.Sprintf("%s:%d", shared, p)
		start(t, []string{"memory node"}, "memnode", "--listen", addr, "--etcd", etcd)
		nodeAddrs = append(nodeAddrs, addr)
	}
	serve := []string{"serve", "--replicas", "2", "--etcd", etcd, "--volume", "disk0:4MiB", "--cache", "1MiB",
		"--page", "", "--mount", "", "--volume-lease", "1s", "--op-timeout", "1m"}
	old, err := bench.StartChild(context.Background(), "ip", []string{"NBD server"},
		append([]string{"netns", "exec", vn.ns, pd3Bin}, append(serve, "--nbd", vn.nsIP+":10809", "--writeback", "200ms")...)...)
	require.NoError(t, err)
	t.Cleanup(old.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("old host:\n%s", old.Output())
		}
	})
	block := func(s string) []byte { return append([]byte(s), make([]byte, 4096-len(s))...) }
	nc, err := nbdclient.Dial(old.Addrs["NBD server"], "disk0")
	require.NoError(t, err)
	require.NoError(t, nc.Write(0, block("flushed by the old host")))
	require.NoError(t, nc.Flush())
	require.NoError(t, nc.Write(0, block("the old host's late write")))
	heal := vn.Cut() // the write-back of the late write waits in the cut link
	nc.Close()

	next := start(t, []string{"NBD server"}, append(serve, "--nbd", "127.0.0.1:0")...) // waits out the old hold
	nc, err = nbdclient.Dial(next.Addrs["NBD server"], "disk0")
	require.NoError(t, err)
	defer nc.Close()
	got := make([]byte, 4096)
	require.NoError(t, nc.Read(0, got))
	assert.Equal(t, block("flushed by the old host"), got, "the new owner reads what the old one flushed")
	require.NoError(t, nc.Write(0, block("the new owner's data")))
	require.NoError(t, nc.Flush())

	heal()
	// Its write-back, sent into the cut link, arrives (TCP retransmits it)
	// and is refused.
	require.NoError(t, old.WaitOutput("fenced: the volume was taken over", time.Minute), "the late write-back is refused")
	require.NoError(t, old.WaitOutput("lost this host's session", time.Minute), "the old host learns it lost the volume")
	ctx := context.Background()
	for _, addr := range nodeAddrs {
		c, err := memnode.Dial(ctx, addr, memnode.ClientOptions{})
		require.NoError(t, err)
		vols, err := c.List(ctx)
		require.NoError(t, err)
		var held int
		for _, v := range vols {
			if v.Stored == 0 {
				continue
			}
			held++
			require.NoError(t, c.ReadAt(ctx, v.ID, 0, got))
			assert.Equal(t, block("the new owner's data"), got, "node %s volume %q", addr, v.Name)
		}
		assert.Equal(t, 1, held, "node %s holds the volume's one extent", addr)
		c.Close()
	}
	require.NoError(t, nc.Read(0, got))
	assert.Equal(t, block("the new owner's data"), got)
}

// TestPartitionedMemnodeGivesEIO: the memory node runs in its own network
// namespace behind a veth pair; with the link taken down (packets vanish,
// no reset) reads that miss the cache fail with EIO within --op-timeout;
// with it back up they succeed and the flushed data is intact.
func TestPartitionedMemnodeGivesEIO(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	if _, err := exec.LookPath("qemu-io"); err != nil {
		t.Skip("qemu-io is not installed (make deps-system)")
	}
	vn := newVethNS(t)
	ns, nodeIP := vn.ns, vn.nsIP

	c, err := bench.StartChild(context.Background(), "ip", []string{"memory node"}, "netns", "exec", ns, pd3Bin, "memnode", "--listen", nodeIP+":7100")
	require.NoError(t, err)
	t.Cleanup(c.Stop)
	host := start(t, []string{"NBD server"}, "serve", "--memnode", nodeIP+":7100", "--volume", "disk0:64MiB",
		"--cache", "256KiB", "--nbd", "127.0.0.1:0", "--page", "", "--mount", "", "--dpu", "none", "--op-timeout", "1s")
	uri := "nbd://" + host.Addrs["NBD server"] + "/disk0"
	qemu := func(cmds ...string) (string, error) { return qemuIO(uri, nil, cmds...) }
	out, err := qemu("write -P 0x5a 0 4M", "flush")
	require.NoError(t, err, out)
	require.False(t, qemuFailed(out), out)

	heal := vn.Cut()
	startT := time.Now()
	out, _ = qemu("read -P 0x5a 32M 64k") // not cached: must reach the node
	took := time.Since(startT)
	assert.Contains(t, out, "Input/output error", "a partitioned memory node is an I/O error")
	assert.Less(t, took, 15*time.Second, "bounded by --op-timeout, not a hang (took %v)", took)

	heal()
	require.Eventually(t, func() bool {
		out, err := qemu("read -P 0x5a 0 4M", "read -P 0 32M 64k")
		return err == nil && !qemuFailed(out)
	}, 30*time.Second, 200*time.Millisecond, "service resumes after the partition and the flushed data is intact")
}

// TestRestartAfterKillOnSameMount: a pd3 killed with SIGKILL leaves a dead
// FUSE mount behind; the next pd3 on that mount point detaches it, says
// so, and comes up. Another filesystem mounted there is refused by name.
func TestRestartAfterKillOnSameMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root here")
	}
	if err := fs.Available(); err != nil {
		t.Skip(err)
	}
	mnt := filepath.Join(t.TempDir(), "mnt")
	t.Cleanup(func() {
		for mounted(mnt) {
			if syscall.Unmount(mnt, syscall.MNT_DETACH) != nil {
				break
			}
		}
	})
	args := []string{"up", "--mount", mnt, "--page", "", "--nbd", "", "--volume", "disk0:16MiB", "--cache", "1MiB"}
	first := start(t, []string{"memory node"}, args...)
	require.NoError(t, first.WaitOutput("mounted at", 10*time.Second))
	require.NoError(t, syscall.Kill(first.Pid, syscall.SIGKILL))
	first.Stop() // reaps it
	var st syscall.Statfs_t
	require.ErrorIs(t, syscall.Statfs(mnt, &st), syscall.ENOTCONN, "the killed pd3 left a dead mount")

	second := start(t, []string{"memory node"}, args...)
	require.NoError(t, second.WaitOutput("mounted at", 10*time.Second), second.Output())
	assert.Contains(t, second.Output(), "pd3: warning: detached a dead pd3 mount at "+mnt)
	assert.NotContains(t, second.Output(), "is not empty")
	require.NoError(t, os.WriteFile(filepath.Join(mnt, "f"), []byte("alive"), 0o644))
	second.Stop()
	assert.False(t, mounted(mnt), "a clean stop unmounts")

	// A file in the directory itself: the mount hides it, and says so.
	require.NoError(t, os.WriteFile(filepath.Join(mnt, "mine"), nil, 0o644))
	third := start(t, []string{"memory node"}, args...)
	require.NoError(t, third.WaitOutput("mounted at", 10*time.Second), third.Output())
	assert.Contains(t, third.Output(), "pd3: warning: "+mnt+" is not empty: the mount hides its 1 entry until pd3 stops")
	third.Stop()
	require.NoError(t, os.Remove(filepath.Join(mnt, "mine")))

	require.NoError(t, syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"))
	out, err := run(t, "", args...)
	require.Error(t, err)
	assert.Contains(t, out, "is already a mount point (tmpfs from tmpfs)")
	assert.True(t, mounted(mnt), "another filesystem's mount is left alone")
}

// The access token may come from $PD3_TOKEN; it must never be printed
// (cobra prints a flag's default in --help), yet still be used.
func TestTokenFromEnvironmentIsUsedAndNeverPrinted(t *testing.T) {
	const secret = "canary-9f2e1d"
	t.Setenv("PD3_TOKEN", secret)
	for _, cmd := range []string{"up", "serve", "mount", "memnode", "dpu"} {
		out, err := run(t, "", cmd, "--help")
		require.NoError(t, err, cmd)
		assert.Contains(t, out, "--token", cmd)
		assert.NotContains(t, out, secret, "pd3 %s --help prints the token", cmd)
	}

	node := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0")
	host := start(t, []string{"page server"}, "serve", "--memnode", node.Addrs["memory node"], "--page", "127.0.0.1:0", "--nbd", "", "--volume", "disk0:4MiB")
	host.Stop()
	out, err := run(t, "", "serve", "--memnode", node.Addrs["memory node"], "--token", "wrong", "--page", "127.0.0.1:0", "--nbd", "")
	require.Error(t, err)
	assert.Contains(t, out, "unauthorised")
	assert.NotContains(t, out, secret)
}

// The systemd units are valid (systemd-analyze verify, with the unit's
// binary path pointed at the test's build).
func TestSystemdUnitsVerify(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze is not installed")
	}
	units, err := filepath.Glob("../../deploy/systemd/*.service")
	require.NoError(t, err)
	require.NotEmpty(t, units)
	dir := t.TempDir()
	var paths []string
	for _, u := range units {
		b, err := os.ReadFile(u)
		require.NoError(t, err)
		p := filepath.Join(dir, filepath.Base(u))
		require.NoError(t, os.WriteFile(p, bytes.ReplaceAll(b, []byte("/usr/local/bin/pd3"), []byte(pd3Bin)), 0o644))
		paths = append(paths, p)
	}
	out, err := exec.Command("systemd-analyze", append([]string{"verify"}, paths...)...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Empty(t, strings.TrimSpace(string(out)), "warnings")
}

// The systemd units are hardened: systemd-analyze rates each one's
// exposure at most 4.0 ("OK"), from the files as shipped.
func TestSystemdUnitsAreHardened(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze is not installed (apt-get install systemd; .ci/run does)")
	}
	units, err := filepath.Glob("../../deploy/systemd/*.service")
	require.NoError(t, err)
	require.Len(t, units, 2)
	overall := regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`)
	for _, u := range units {
		out, _ := exec.Command("systemd-analyze", "security", "--offline=true", u).CombinedOutput()
		m := overall.FindSubmatch(out)
		require.NotNil(t, m, "%s:\n%s", u, out)
		exposure, err := strconv.ParseFloat(string(m[1]), 64)
		require.NoError(t, err)
		assert.LessOrEqual(t, exposure, 4.0, "%s:\n%s", u, out)
		t.Logf("%s: exposure %.1f", filepath.Base(u), exposure)
	}
}

// pd3 certs makes what --tls-certificates and the memory-node link need:
// a host serving NBD with --tls require is read by nbdinfo with the
// client directory, and a second run never overwrites a key.
func TestCertsServeTLS(t *testing.T) {
	if _, err := exec.LookPath("nbdinfo"); err != nil {
		t.Skip("nbdinfo is not installed (make deps-system; .ci/run does)")
	}
	dir := t.TempDir()
	srv, cli := filepath.Join(dir, "server"), filepath.Join(dir, "client")
	out, err := run(t, "", "certs", "--server-dir", srv, "--client-dir", cli)
	require.NoError(t, err, out)
	assert.Contains(t, out, "server certificate for [127.0.0.1 localhost] in "+srv)
	key, err := os.Stat(filepath.Join(srv, "server-key.pem"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), key.Mode().Perm(), "keys are the owner's only")

	host := start(t, []string{"NBD server"}, "up", "--page", "", "--mount", "", "--nbd", "127.0.0.1:0", "--volume", "disk0:4MiB",
		"--tls", "require", "--tls-certificates", srv)
	_, port, err := net.SplitHostPort(host.Addrs["NBD server"])
	require.NoError(t, err)
	size, err := exec.Command("nbdinfo", "--size", "nbds://localhost:"+port+"/disk0?tls-certificates="+cli).CombinedOutput()
	require.NoError(t, err, "%s", size)
	assert.Equal(t, "4194304", strings.TrimSpace(string(size)))

	out, err = run(t, "", "certs", "--server-dir", srv, "--client-dir", filepath.Join(dir, "other"))
	require.Error(t, err)
	assert.Contains(t, out, filepath.Join(srv, "ca-cert.pem")+" exists: remove it, or choose another directory (nothing was written)")
	_, err = os.Stat(filepath.Join(dir, "other"))
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing was written")
}

// Under systemd (Type=notify) pd3 reports READY=1 once it listens and
// STOPPING=1 when SIGTERM starts its shutdown, on $NOTIFY_SOCKET.
func TestSystemdNotify(t *testing.T) {
	for _, args := range [][]string{
		{"memnode", "--listen", "127.0.0.1:0"},
		{"up", "--page", "127.0.0.1:0", "--nbd", "", "--mount", "", "--volume", "disk0:4MiB"},
	} {
		t.Run(args[0], func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "notify")
			conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
			require.NoError(t, err)
			defer conn.Close()
			cmd := exec.Command(pd3Bin, args...)
			cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
			var stderr testutil.SyncBuffer
			cmd.Stderr = &stderr
			require.NoError(t, cmd.Start())
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

			read := func() string {
				conn.SetReadDeadline(time.Now().Add(30 * time.Second))
				buf := make([]byte, 4096)
				n, err := conn.Read(buf)
				require.NoError(t, err, "no notification; stderr:\n%s", stderr.String())
				return string(buf[:n])
			}
			ready := read()
			assert.Contains(t, ready, "READY=1")
			assert.Contains(t, ready, "STATUS=")
			// stderr is copied by a goroutine of exec: it may lag the datagram.
			assert.Eventually(t, func() bool { return strings.Contains(stderr.String(), "listening") }, 5*time.Second, 10*time.Millisecond,
				"READY comes after the servers listen")
			require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
			assert.Equal(t, "STOPPING=1", read())
			require.NoError(t, cmd.Wait(), "stderr:\n%s", stderr.String())
		})
	}
}

// pd3 top --once draws one frame of a live host's rates: requests,
// latency per operation, the cache.
func TestTopOnce(t *testing.T) {
	host := start(t, []string{"page server", "metrics", "NBD server"}, "up", "--page", "127.0.0.1:0", "--nbd", "127.0.0.1:0", "--mount", "",
		"--volume", "disk0:16MiB", "--cache", "1MiB", "--metrics", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := pageproto.Dial(ctx, host.Addrs["page server"], pageproto.ClientOptions{})
	require.NoError(t, err)
	defer c.Close()
	go func() { // load while top measures; bounded by the test
		buf := make([]byte, pageid.Size)
		for i := uint64(0); ctx.Err() == nil && i < 1e6; i++ {
			if c.Get(ctx, pageid.MakeKey(1, i%4096), buf) != nil {
				return
			}
		}
	}()
	out, err := run(t, "", "top", host.Addrs["metrics"], "--once", "--interval", "500ms")
	require.NoError(t, err, out)
	assert.Contains(t, out, "pd3 top ")
	assert.Regexp(t, `requests/s +NBD 0 +page [1-9]`, out)
	assert.Regexp(t, `latency +page GET +p50 [0-9.]+[µm]?s +p99 `, out)
	assert.Regexp(t, `host cache +hit ratio [0-9.]+% .* resident [0-9.]+k? \([0-9.]+[KM]iB\)`, out)
	assert.NotContains(t, out, "q quits", "--once is not live")
	assert.Contains(t, out, "prefetch/s")
	// The load reads pages in order: the mirrored requests' predictor
	// follows it.
	assert.Regexp(t, `predict/s +pages [0-9.]+k? +accuracy [0-9]+% +on\n`, out)
	if runtime.NumCPU() > 1 { // with one CPU there is no governor
		// Page requests need every core.
		assert.Regexp(t, `Go scheduler +all cores +switches/s 0\n`, out)
	}

	out, err = run(t, "", "top", "127.0.0.1:1", "--once")
	require.Error(t, err)
	assert.Contains(t, out, "scraping http://127.0.0.1:1/metrics")

	out, err = run(t, "", "top", host.Addrs["NBD server"], "--once")
	require.Error(t, err)
	assert.Contains(t, out, "the address answers NBD, not metrics: give the address the process's --metrics flag was given")
}

// Under a terminal (script(1) gives it a pseudo-terminal) pd3 top redraws
// in place and q quits it.
func TestTopQuitsOnQInATerminal(t *testing.T) {
	if _, err := exec.LookPath("script"); err != nil {
		t.Skip("script(1) is not installed")
	}
	host := start(t, []string{"metrics"}, "up", "--page", "", "--nbd", "", "--mount", "", "--volume", "disk0:8MiB", "--metrics", "127.0.0.1:0")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "script", "-q", "-e", "-c", pd3Bin+" top "+host.Addrs["metrics"]+" --interval 200ms", "/dev/null")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	var out testutil.SyncBuffer
	cmd.Stdout = &out
	require.NoError(t, cmd.Start())
	require.Eventually(t, func() bool { return strings.Count(out.String(), "pd3 top ") >= 2 }, 10*time.Second, 20*time.Millisecond,
		"two frames drawn:\n%s", out.String())
	_, err = stdin.Write([]byte("q"))
	require.NoError(t, err)
	require.NoError(t, cmd.Wait(), "q quits with status 0")
	assert.Contains(t, out.String(), "\x1b[H\x1b[2J", "frames redraw the screen")
}

// The memory-node link over mutual TLS, with real processes: a node that
// requires client certificates, a split agent and a host that present
// theirs; a host in clear and a misconfigured up are refused with reasons.
func TestMemnodeLinkOverMutualTLS(t *testing.T) {
	serverDir, clientDir := testutil.TestCA(t)
	srv, cli := tlsfiles.ServerFiles(serverDir), tlsfiles.ClientFiles(clientDir)
	node := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0",
		"--tls-ca", srv.CA, "--tls-cert", srv.Cert, "--tls-key", srv.Key)
	assert.Contains(t, node.Output(), "mutual TLS")
	addr := node.Addrs["memory node"]
	link := []string{"--memnode", addr, "--memnode-tls-ca", cli.CA, "--memnode-tls-cert", cli.Cert, "--memnode-tls-key", cli.Key}
	name := fmt.Sprintf("tls%d", os.Getpid())
	start(t, []string{"dpu agent"}, append([]string{"dpu", "--shm", name, "--lz", "256KiB", "--cache", "64KiB"}, link...)...)
	serve := append([]string{"serve", "--dpu", "shm:" + name, "--page", "127.0.0.1:0", "--nbd", "", "--volume", "disk0:1MiB"}, link...)
	host := start(t, []string{"page server"}, serve...)
	out, err := run(t, "sealed in transit", "page", "put", "--page", host.Addrs["page server"], "1:5")
	require.NoError(t, err, out)
	host.Stop() // writes the page back over TLS
	host = start(t, []string{"page server"}, serve...)
	out, err = run(t, "", "page", "get", "--page", host.Addrs["page server"], "1:5") // a miss, read by the agent
	require.NoError(t, err, out)
	assert.True(t, strings.HasPrefix(out, "sealed in transit\x00"))

	out, err = run(t, "", "serve", "--memnode", addr, "--page", "127.0.0.1:0", "--nbd", "")
	require.Error(t, err)
	assert.Contains(t, out, "the node requires TLS")
	out, err = run(t, "", "serve", "--memnode", addr, "--memnode-tls-ca", cli.CA, "--page", "127.0.0.1:0", "--nbd", "")
	require.Error(t, err, "no client certificate")
	assert.Contains(t, out, "certificate required")
	out, err = run(t, "", "up", "--memnode-tls-ca", cli.CA, "--page", "127.0.0.1:0", "--nbd", "", "--mount", "")
	require.Error(t, err)
	assert.Contains(t, out, "the embedded memory node speaks in clear")
	out, err = run(t, "", "serve", "--memnode", addr, "--memnode-tls-cert", cli.Cert, "--page", "127.0.0.1:0", "--nbd", "")
	require.Error(t, err)
	assert.Contains(t, out, "connecting needs the CA")
}

// The control plane with real processes: a standalone etcd member (pd3
// coord), two memory nodes registered with it; pd3 cluster status shows
// both up, and one SIGKILLed turns down once its lease runs out. pd3 up
// starts its own etcd and says where.
func TestClusterStatus(t *testing.T) {
	coord := start(t, []string{"etcd"}, "coord", "--listen", "127.0.0.1:0", "--dir", t.TempDir())
	etcd := coord.Addrs["etcd"]
	a := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0", "--etcd", etcd, "--cluster", "c1")
	b := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0", "--etcd", etcd, "--cluster", "c1", "--capacity", "64MiB")
	assert.Regexp(t, `node [0-9a-f]{12} of cluster c1`, a.Output())

	status := func() []cluster.Node {
		out, err := run(t, "", "cluster", "status", "--etcd", etcd, "--cluster", "c1", "--json")
		require.NoError(t, err, out)
		var st struct{ Nodes []cluster.Node }
		require.NoError(t, json.Unmarshal([]byte(out), &st), out)
		return st.Nodes
	}
	nodes := status()
	require.Len(t, nodes, 2)
	addrs := map[string]string{}
	for _, n := range nodes {
		assert.True(t, n.Up)
		addrs[n.Addr] = n.ID
	}
	require.Contains(t, addrs, a.Addrs["memory node"])
	require.Contains(t, addrs, b.Addrs["memory node"])
	// A write shows in IN USE at once: the node's answer, not the figure
	// it renews in etcd every few seconds.
	ctx := context.Background()
	mc, err := memnode.Dial(ctx, a.Addrs["memory node"], memnode.ClientOptions{})
	require.NoError(t, err)
	v, err := mc.Create(ctx, "v1", 4<<20)
	require.NoError(t, err)
	require.NoError(t, mc.WriteAt(ctx, v.ID, 0, make([]byte, pageid.Size)))
	mc.Close()
	for _, n := range status() {
		if n.Addr == a.Addrs["memory node"] {
			assert.Equal(t, uint64(memnode.ChunkSize), n.Stored, "the chunk just written")
		}
	}
	out, err := run(t, "", "cluster", "status", "--etcd", etcd, "--cluster", "c1")
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^[0-9a-f]{12} +up +`+regexp.QuoteMeta(b.Addrs["memory node"])+` +64MiB +`, out)

	p, _ := os.FindProcess(b.Pid)
	require.NoError(t, p.Signal(syscall.SIGKILL)) // no goodbye
	b.Stop()                                      // reaped: its port refuses
	// At once, long before its lease in etcd runs out: it does not answer.
	out, err = run(t, "", "cluster", "status", "--etcd", etcd, "--cluster", "c1")
	require.NoError(t, err, out)
	assert.Regexp(t, `(?m)^[0-9a-f]{12} +unreachable +`+regexp.QuoteMeta(b.Addrs["memory node"])+` `, out)
	assert.Contains(t, out, "is up in etcd but did not answer")
	require.Eventually(t, func() bool {
		for _, n := range status() {
			if n.Addr == b.Addrs["memory node"] {
				return !n.Up
			}
		}
		return false
	}, 15*time.Second, 200*time.Millisecond, "the killed node is down once its lease runs out")

	// A dead volatile node never comes back: drain has nothing to move,
	// forget removes it; a node that is up cannot be forgotten.
	bID, aID := addrs[b.Addrs["memory node"]], addrs[a.Addrs["memory node"]]
	out, err = run(t, "", "node", "drain", bID, "--etcd", etcd, "--cluster", "c1")
	require.Error(t, err)
	assert.Contains(t, out, "node "+bID+" is down: nothing can be copied off it")
	out, err = run(t, "", "node", "forget", aID, "--etcd", etcd, "--cluster", "c1")
	require.Error(t, err)
	assert.Contains(t, out, "the node is up: node "+aID+": stop it first")
	out, err = run(t, "", "node", "forget", bID, "--etcd", etcd, "--cluster", "c1")
	require.NoError(t, err, out)
	assert.Contains(t, out, "node "+bID+" forgotten")
	require.Len(t, status(), 1, "only the live node is left")
	out, err = run(t, "", "node", "forget", bID, "--etcd", etcd, "--cluster", "c1")
	require.Error(t, err)
	assert.Contains(t, out, "no memory node "+bID+" in cluster c1")

	out, err = run(t, "", "memnode", "--listen", "127.0.0.1:0", "--etcd", "127.0.0.1:1")
	require.Error(t, err)
	assert.Contains(t, out, "etcd unreachable at 127.0.0.1:1")

	up := start(t, []string{"etcd", "page server"}, "up", "--page", "127.0.0.1:0", "--nbd", "", "--mount", "", "--volume", "disk0:4MiB")
	out, err = run(t, "", "cluster", "status", "--etcd", up.Addrs["etcd"])
	require.NoError(t, err, out)
	assert.Contains(t, out, "cluster pd3: 1 memory node\n")
	assert.Contains(t, out, "\n1 volume\n")
	assert.Regexp(t, fmt.Sprintf(`(?m)^disk0 +4MiB +\S+ +[0-9a-f]{12} +\S+ pid %d$`, up.Pid), out, "the volume and the host holding it")
	up.Stop()
	for _, line := range strings.Split(strings.TrimSpace(up.Output()), "\n") {
		assert.True(t, strings.HasPrefix(line, "pd3: "), "etcd's own logging reached stderr: %q", line)
	}
}

// Volumes held through the control plane, real processes: a host holds
// its volume in etcd; a second host on the same volume is refused; once
// the first is SIGKILLed, its session expires and a third host takes the
// volume over, with the writes the first acknowledged and synced intact.
func TestVolumesHeldInEtcd(t *testing.T) {
	coord := start(t, []string{"etcd"}, "coord", "--listen", "127.0.0.1:0", "--dir", t.TempDir())
	etcd := coord.Addrs["etcd"]
	node := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0", "--etcd", etcd)
	serve := []string{"serve", "--memnode", node.Addrs["memory node"], "--etcd", etcd, "--volume-lease", "1s",
		"--page", "127.0.0.1:0", "--nbd", "", "--volume", "disk0:1MiB"}
	first := start(t, []string{"page server"}, serve...)
	out, err := run(t, "acknowledged and synced", "page", "put", "--page", first.Addrs["page server"], "1:2")
	require.NoError(t, err, out)
	out, err = run(t, "", "page", "sync", "--page", first.Addrs["page server"])
	require.NoError(t, err, out)

	out, err = run(t, "", serve...)
	require.Error(t, err)
	assert.Contains(t, out, `volume "disk0" is served by another host`)
	assert.Contains(t, out, `cluster: volume "disk0": held by another host`)

	p, _ := os.FindProcess(first.Pid)
	require.NoError(t, p.Signal(syscall.SIGKILL))
	begin := time.Now()
	third := start(t, []string{"page server"}, serve...)
	assert.Less(t, time.Since(begin), 10*time.Second, "the dead host's session expired within its TTL")
	out, err = run(t, "", "page", "get", "--page", third.Addrs["page server"], "1:2")
	require.NoError(t, err, out)
	assert.True(t, strings.HasPrefix(out, "acknowledged and synced\x00"))
}

// pd3 bench scale end to end on a few small configurations: each row
// has its times, memory and etcd figures, and the chart is drawn.
func TestBenchScaleSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several processes")
	}
	t.Parallel() // with the other smoke runs, once the serial tests are done
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("fio is not installed (make deps-system)")
	}
	plotPath := filepath.Join(t.TempDir(), "scale.png")
	out, err := run(t, "", "bench", "scale", "--volumes", "1,4", "--sizes", "8MiB", "--written", "4MiB", "--idle", "200ms",
		"--node-counts", "1", "--host-counts", "1", "--host-nodes", "1", "--io-size", "8MiB", "--runtime", "1s", "--ramp", "0s",
		"--json", "--plot", plotPath)
	require.NoError(t, err, out)
	var rep bench.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Len(t, rep.Results, 3+2+4) // volumes 1 and 4, one size; nodes=1 two jobs; hosts=1 two jobs, pd3 and the ceiling
	io := rep.Results[3:]
	for _, r := range io {
		assert.Positive(t, r.OpsPerSec, "%s %s", r.System, r.Config)
		if r.System == "pd3" {
			assert.Positive(t, r.HostCPUusOp, r.Config)
			assert.Positive(t, r.EtcdReqPerSec, r.Config)
		}
	}
	assert.Equal(t, "nbdkit-memory", io[len(io)-1].System, "the ceiling in the same run")
	for _, r := range rep.Results[:3] {
		assert.Positive(t, r.CreateMillis, r.Config)
		assert.Positive(t, r.OpenMillis, r.Config)
		assert.Positive(t, r.HostRSS, r.Config)
		assert.Positive(t, r.EtcdKeys, r.Config)
		assert.Positive(t, r.MapBytes, r.Config)
	}
	assert.Equal(t, []string{"volumes=1", "volumes=4", "size=8MiB"}, []string{rep.Results[0].Config, rep.Results[1].Config, rep.Results[2].Config})
	assert.Greater(t, rep.Results[1].EtcdKeys, rep.Results[0].EtcdKeys, "a record and a hold per volume")
	assert.GreaterOrEqual(t, rep.Results[2].MemnodeStored, uint64(4<<20), "the bytes written are stored at the nodes")
	assert.FileExists(t, plotPath)
}

// pd3 bench repair end to end on a small volume: the killed node holds
// some extents, they are copied, and the figures are there.
func TestBenchRepairSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several processes")
	}
	t.Parallel() // with the other smoke runs, once the serial tests are done
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("fio is not installed (make deps-system)")
	}
	out, err := run(t, "", "bench", "repair", "--size", "64MiB", "--json")
	require.NoError(t, err, out)
	var rep bench.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Len(t, rep.Results, 1)
	assert.NotZero(t, rep.Results[0].Ops, "the killed node held extents")
	assert.Greater(t, rep.Ratios["repair-gib-per-s"], 0.0)
	assert.Greater(t, rep.Ratios["seconds-to-healthy"], rep.Ratios["seconds-to-down"])
	assert.InDelta(t, 1.0, rep.Ratios["memnode-rss/stored"], 1.0, "RSS per byte stored is about one")
}

// pd3 bench apps runs fio under a memory budget on ext4 over nbdfuse over
// nbdkit and pd3, checks the filesystem afterwards, and reports the
// agent's accuracy (a small run: the harness, not the numbers).
func TestBenchAppsSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several processes")
	}
	t.Parallel() // with the other smoke runs, once the serial tests are done
	if os.Geteuid() != 0 {
		t.Skip("needs root (memory cgroups, loop devices, mounts)")
	}
	if err := fs.Available(); err != nil {
		t.Skip(err)
	}
	for _, bin := range []string{"nbdkit", "nbdfuse", "fio", "mkfs.ext4"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed (make deps-system)", bin)
		}
	}
	testutil.LockPageCache(t) // the benchmark drops the page cache
	// Counted, not timed: every fio job ends after its reads (the
	// duration only bounds a run that hangs).
	out, err := run(t, "", "bench", "apps", "--systems", "nbdkit-memory,pd3", "--workloads", "fio-zipf,fio-seq4",
		"--local-memory", "48MiB", "--size", "256MiB", "--fio-size", "64MiB", "--cache", "8MiB",
		"--fio-io", "64MiB", "--duration", "40s", "--rounds", "1", "--json")
	require.NoError(t, err, out)
	var rep bench.Report
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Len(t, rep.Results, 4)
	got := map[string]bench.Result{}
	for _, r := range rep.Results {
		got[r.System+" "+r.Config] = r
		reads := map[string]uint64{"fio-seq4@48MiB": 4 * 64 << 20 / (128 << 10), "fio-zipf@48MiB": 4 * 64 << 20 / 4096}
		assert.Equal(t, reads[r.Config], r.Ops, r.System+" "+r.Config)
		assert.Positive(t, r.OpsPerSec, r.System)
		assert.Equal(t, "ok", r.Integrity, r.System)
		assert.Positive(t, r.BudgetPeak, "the budget's peak is read")
	}
	assert.Contains(t, rep.Ratios, "pd3/nbdkit-memory@fio-seq4@48MiB")

	// Four sequential streams under the budget: the kernel's readahead
	// reaches pd3 as runs of 128 KiB reads, which the NBD predictor
	// follows, and what it prefetches is read.
	seq := got["pd3 fio-seq4@48MiB"].Counters
	require.Positive(t, seq["predict_requests_pages_total"], "the agent predicted the streams")
	assert.GreaterOrEqual(t, seq["predict_requests_useful_total"], 0.6*(seq["predict_requests_useful_total"]+seq["predict_requests_wasted_total"]),
		"the predictions were read: %v", seq)
	assert.GreaterOrEqual(t, seq["prefetch_consumed_total"], 0.6*seq["prefetch_placed_total"], "the prefetched pages were consumed: %v", seq)
	assert.Zero(t, seq["predict_requests_off"], "the governor keeps an accurate predictor on")
	// Random reads: the predictor seldom finds a stream to follow, and
	// what it proposes is a sliver of the misses (the governor switching
	// it off is TestNBDPredictorFollowsScansAndStepsAside's, in host).
	zipf := got["pd3 fio-zipf@48MiB"].Counters
	require.Positive(t, zipf["cache_misses_total"], "the reads reached pd3: %v", zipf)
	assert.Less(t, zipf["predict_requests_pages_total"], 0.1*zipf["cache_misses_total"], "random reads, few guesses: %v", zipf)

	// sqlite and fio on the pd3 mount, on the mount as a perfect
	// prefetcher would serve it (decision 43), and on bindfs over tmpfs,
	// if there.
	systems := "pd3-mount,pd3-mount-oracle"
	if _, err := exec.LookPath("bindfs"); err == nil {
		systems += ",bindfs"
	}
	// and a tree of small files archived and searched.
	out, err = run(t, "", "bench", "apps", "--systems", systems, "--workloads", "sqlite-point,sqlite-scan,fio-seq4,tree-tar,tree-grep",
		"--local-memory", "48MiB", "--sqlite-rows", "5000", "--fio-size", "8MiB", "--tree-files", "450", "--cache", "8MiB",
		"--duration", "1s", "--rounds", "1", "--json")
	require.NoError(t, err, out)
	rep = bench.Report{}
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Len(t, rep.Results, 5*len(strings.Split(systems, ",")))
	shadowed := 0.0
	for _, r := range rep.Results {
		assert.Positive(t, r.OpsPerSec, r.System+" "+r.Config)
		assert.Equal(t, "ok", r.Integrity, r.System+" "+r.Config)
		if r.System == "pd3-mount" {
			assert.Contains(t, r.Counters, "cache_misses_total", "the mount's counters are read: "+r.Config)
		}
		shadowed += r.Counters["cache_shadow_pages_total"]
	}

	// The oracle's reads were fetched again (in runs, some of them still
	// pending when a workload ends).
	assert.Positive(t, shadowed, "the oracle fetched what it served")

	out, err = run(t, "", "bench", "apps", "--local-memory", "1MiB")
	require.Error(t, err)
	assert.Contains(t, out, "below 32MiB")
}

// waitOps waits until the history holds n more operations than now: the
// clients made progress.
func waitOps(t *testing.T, hist *linearize.History, n int) {
	t.Helper()
	target := hist.Len() + n
	require.Eventually(t, func() bool { return hist.Len() >= target }, 60*time.Second, 5*time.Millisecond,
		"the clients stopped making progress (%d of %d operations)", hist.Len(), target)
}

// TestMemnodeServesMetrics: `pd3 memnode --metrics` answers a scrape with
// the requests it served, the bytes they carried and the memory it holds.
func TestMemnodeServesMetrics(t *testing.T) {
	node := start(t, []string{"memory node", "metrics"}, "memnode", "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--capacity", "8MiB")
	ctx := context.Background()
	c, err := memnode.Dial(ctx, node.Addrs["memory node"], memnode.ClientOptions{})
	require.NoError(t, err)
	defer c.Close()
	v, err := c.Create(ctx, "disk0", 1<<20)
	require.NoError(t, err)
	page := make([]byte, pageid.Size)
	require.NoError(t, c.WriteAt(ctx, v.ID, 0, page))
	require.NoError(t, c.ReadAt(ctx, v.ID, 0, page))

	resp, err := http.Get(node.Addrs["metrics"])
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := string(body)
	for _, want := range []string{
		`pd3_memnode_requests_total{op="WRITE"} 1`,
		`pd3_memnode_requests_total{op="READ"} 1`,
		`pd3_memnode_requests_total{op="CREATE"} 1`,
		"pd3_memnode_written_bytes_total 4096",
		"pd3_memnode_read_bytes_total 4096",
		"pd3_memnode_connections_open 1",
		"pd3_memnode_volumes 1",
		fmt.Sprintf("pd3_memnode_used_bytes %g", float64(memnode.ChunkSize)),
		"pd3_memnode_capacity_bytes 8.388608e+06",
		"pd3_memnode_failed_requests_total 0",
	} {
		assert.Contains(t, m, want+"\n")
	}
}

// A serving process runs every thread in SCHED_BATCH (docs/decisions.md,
// 47); --sched normal, or a benchmark's $PD3_SCHED, keeps the normal
// class.
func TestServingProcessesRunInTheBatchClass(t *testing.T) {
	classes := func(pid int) map[uint32]int {
		t.Helper()
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		require.NoError(t, err)
		out := map[uint32]int{}
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			require.NoError(t, err)
			if p, err := sched.Policy(tid); err == nil {
				out[p]++
			}
		}
		return out
	}
	node := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0")
	got := classes(node.Pid)
	assert.Positive(t, got[unix.SCHED_BATCH])
	assert.Zero(t, got[unix.SCHED_NORMAL], "threads left in the normal class")

	normal := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0", "--sched", "normal")
	got = classes(normal.Pid)
	assert.Zero(t, got[unix.SCHED_BATCH])

	t.Setenv("PD3_SCHED", "normal") // as `pd3 bench --sched normal` passes it on
	inherited := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0")
	got = classes(inherited.Pid)
	assert.Zero(t, got[unix.SCHED_BATCH])

	out, err := run(t, "", "memnode", "--sched", "idle")
	require.Error(t, err)
	assert.Contains(t, out, `"idle" is no scheduling class of pd3's: want batch or normal`)
}
