package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pd3-go/pd3/internal/memcg"
	"github.com/pd3-go/pd3/internal/units"
)

// AppsOptions configure the applications benchmark.
type AppsOptions struct {
	Exe       string
	Systems   []string
	Workloads []string
	// Budgets are the memory limits the applications run under (their
	// processes and the page cache they fill); 0 is no limit.
	Budgets []uint64
	// Scale is pgbench's scale factor (15 MiB of data each).
	Scale    int
	Clients  int
	Duration time.Duration
	// Cache is pd3's host cache.
	Cache uint64
	// Size is the export (the block device under the filesystem).
	Size uint64
	// FioSize is the file the fio workloads read (default 512 MiB).
	FioSize uint64
	// FioIO, if set, ends each fio job once it has read this many bytes
	// (or at Duration, whichever comes first) instead of at Duration: a
	// run whose work is counted, not timed.
	FioIO uint64
	// FioWarmup runs fio-zipf this long, unmeasured, before its measured
	// run: the kernel's page cache starts empty (dropped after the load),
	// and a run that includes filling it measures how fast the hot set
	// arrives rather than the steady state under the budget.
	FioWarmup time.Duration
	// SqliteRows is the sqlite table's rows of 1 KiB (default 300 000:
	// about 330 MB).
	SqliteRows int
	// TreeFiles is the number of files of the tree workloads (default
	// 20 000).
	TreeFiles int
	Rounds    int
	// PD3Args are added to every pd3 host's command line (e.g. --policy).
	PD3Args []string
	// NodeArgs are added to the memory node's command line of every pd3
	// NBD system (e.g. --poll-for 0).
	NodeArgs []string
	Progress Progress
}

// AppsSystems are the exports the applications run on, each under the
// same memory budget except local:
//   - local: nbdkit memory and no budget at all (everything stays in the
//     kernel's page cache after its first read);
//   - nbdkit-memory: nbdkit holding the data in its own RAM, outside the
//     budget: the ceiling of any design whose data is elsewhere;
//   - relay: nbdkit's nbd plugin in front of a second nbdkit memory, no
//     cache: the plain remote peer (nbdkit's cache filter corrupts
//     PostgreSQL's data here, docs/decisions.md, 24);
//   - pd3-noagent (--dpu none), pd3-leap (--dpu none --prefetch leap) and
//     pd3 (the embedded agent): a memory node process and a host process,
//     the host's cache outside the budget like the peers' memory;
//   - pd3-cached: pd3 with a host cache as large as the export, so every
//     read after the load is a hit: the ceiling of pd3's own serving, to
//     tell its cost from the memory node's;
//   - pd3-oracle: pd3-cached without the agent, each read also fetching
//     its pages from the memory node and dropping them, unwaited
//     (--shadow-reads): a prefetcher that never lets a read wait and
//     pays every page's transfer (a host whose cache holds some pages
//     pays fewer; docs/decisions.md, 43);
//   - pd3-mount, pd3-mount-noagent, pd3-mount-cached, pd3-mount-oracle
//     and bindfs: filesystems (fsSystems), for the sqlite, fio and tree
//     workloads.
var AppsSystems = []string{"local", "nbdkit-memory", "relay", "pd3-noagent", "pd3-leap", "pd3", "pd3-cached", "pd3-oracle", "pd3-mount", "pd3-mount-noagent", "pd3-mount-cached", "pd3-mount-oracle", "bindfs"}

// fsSystems are the filesystems AppsSystems compares for the file
// workloads (sqlite, fio, trees): the pd3 mount with and without its
// agent, the mount with a host cache as large as the export
// (pd3-mount-cached: every read after the load a hit, the ceiling of the
// mount's own serving, to tell its cost from the memory node's), the same
// paying every read's transfer unwaited (pd3-mount-oracle: a prefetcher
// that never lets a read wait), and bindfs over tmpfs (a plain
// passthrough FUSE filesystem whose data is in the server's RAM: the FUSE
// ceiling). They run no PostgreSQL.
var fsSystems = map[string]string{"pd3-mount": "pd3", "pd3-mount-noagent": "pd3-noprefetch", "pd3-mount-cached": "pd3-cached", "pd3-mount-oracle": "pd3-oracle", "bindfs": "bindfs"}

// AppsWorkloads are what runs on each system, on ext4 on a loop device
// (direct I/O) over nbdfuse over the export: PostgreSQL (pg-scan times a
// sequential scan of pgbench_accounts, in rows/s; pg-select is pgbench
// select-only and pg-tpcb pgbench's TPC-B, in tps) and fio reading a
// file (512 MiB) through the page cache (fio-zipf: 4 threads of 4 KiB reads,
// Zipf 1.1; fio-seq4: 4 sequential streams of 128 KiB reads, each over its
// quarter of the file; IOPS) and sqlite (a table of 1 KiB rows: random
// point lookups by key, lookups/s; a full scan, rows/s, ms in its column).
// A tree of small files is archived (tree-tar) and searched (tree-grep),
// in files/s.
var AppsWorkloads = []string{"pg-scan", "pg-select", "pg-tpcb", "fio-zipf", "fio-seq4", "sqlite-point", "sqlite-scan", "tree-tar", "tree-grep"}

// Apps runs real applications under a memory budget on each system, the
// systems taking turns round by round, and reports the median of each
// with ratios to the ceiling and the relay.
func Apps(ctx context.Context, opt AppsOptions) (*Report, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("bench apps needs root (memory cgroups, loop devices, mounts)")
	}
	for _, w := range opt.Workloads {
		if !slices.Contains(AppsWorkloads, w) {
			return nil, fmt.Errorf("unknown workload %q (have %s)", w, strings.Join(AppsWorkloads, ","))
		}
	}
	for _, s := range opt.Systems {
		if !slices.Contains(AppsSystems, s) {
			return nil, fmt.Errorf("unknown system %q (have %s)", s, strings.Join(AppsSystems, ","))
		}
	}
	pg := ""
	if slices.ContainsFunc(opt.Workloads, func(w string) bool { return strings.HasPrefix(w, "pg-") }) {
		var err error
		if pg, err = findPostgres(); err != nil {
			return nil, err
		}
	}
	for _, bin := range []string{"nbdkit", "nbdfuse", "losetup", "mkfs.ext4", "e2fsck", "fusermount3", "fio", "tar", "grep"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("%s is not installed (make deps-system)", bin)
		}
	}
	opt.Rounds = max(opt.Rounds, 1)
	opt.Scale = cmp.Or(opt.Scale, 20)
	opt.Clients = cmp.Or(opt.Clients, 4)
	opt.FioSize = cmp.Or(opt.FioSize, 512<<20)
	opt.SqliteRows = cmp.Or(opt.SqliteRows, 300000)
	opt.TreeFiles = cmp.Or(opt.TreeFiles, 20000)
	if opt.FioSize%(4*128<<10) != 0 {
		return nil, fmt.Errorf("fio file of %d bytes: want a multiple of 512KiB (four streams of 128KiB reads)", opt.FioSize)
	}
	if opt.FioIO%(128<<10) != 0 {
		return nil, fmt.Errorf("fio I/O of %d bytes per job: want a multiple of 128KiB (fio-seq4's reads)", opt.FioIO)
	}
	rep := &Report{Bench: "apps", Machine: Machine(), Ratios: map[string]float64{}}
	type cell struct{ sys, cfg string }
	runs := map[cell][]Result{}
	pr := progressOr(opt.Progress)
	pr.Begin(opt.Rounds * len(opt.Budgets) * len(opt.Systems) * (2 + len(opt.Workloads)))
	defer pr.End()
	for round := 1; round <= opt.Rounds; round++ {
		for _, budget := range opt.Budgets {
			for _, sys := range opt.Systems {
				b := budget
				if sys == "local" {
					b = 0
				}
				at := fmt.Sprintf(" at %s (round %d/%d)", budgetName(b), round, opt.Rounds)
				step := func(s string) { pr.Step(sys + ": " + s + at) }
				var rs []Result
				var err error
				if _, ok := fsSystems[sys]; ok {
					rs, err = runFS(ctx, opt, sys, b, budget, step)
				} else {
					rs, err = runBlock(ctx, opt, pg, sys, b, budget, step)
				}
				if err != nil {
					return nil, fmt.Errorf("%s%s: %w", sys, at, err)
				}
				for _, r := range rs {
					runs[cell{sys, r.Config}] = append(runs[cell{sys, r.Config}], r)
				}
			}
		}
	}
	val := map[cell]float64{}
	for _, budget := range opt.Budgets {
		for _, w := range opt.Workloads {
			cfg := w + "@" + budgetName(budget)
			for _, sys := range opt.Systems {
				rs := runs[cell{sys, cfg}]
				if len(rs) == 0 {
					continue
				}
				m := medianRun(rs)
				// Integrity is that of every round, not the median's.
				for _, r := range rs {
					if r.Integrity != "ok" {
						m.Integrity = r.Integrity
					}
				}
				rep.Results = append(rep.Results, m)
				val[cell{sys, cfg}] = m.OpsPerSec
			}
			for _, sys := range opt.Systems {
				for _, base := range []string{"nbdkit-memory", "bindfs", "relay", "pd3-noagent", "pd3-mount-noagent", "pd3-leap", "local"} {
					peer := !strings.HasPrefix(sys, "pd3")
					if sys == base || peer && (sys == "nbdkit-memory" || base != "nbdkit-memory" && base != "bindfs") {
						continue
					}
					if a, b := val[cell{sys, cfg}], val[cell{base, cfg}]; a > 0 && b > 0 {
						rep.Ratios[sys+"/"+base+"@"+cfg] = a / b
					}
				}
			}
		}
	}
	pgName := "PostgreSQL"
	if pg != "" {
		pgName += " " + filepath.Base(filepath.Dir(pg))
	}
	fioRun := opt.Duration.String() + " per run"
	if opt.FioIO > 0 {
		fioRun = fmt.Sprintf("%s read by each job (at most %v)", units.FormatSize(opt.FioIO), opt.Duration)
	}
	if opt.FioWarmup > 0 && slices.Contains(opt.Workloads, "fio-zipf") {
		fioRun += fmt.Sprintf(", fio-zipf after %v unmeasured that warm the page cache", opt.FioWarmup)
	}
	rep.Notes = append(rep.Notes,
		fmt.Sprintf("ext4 on a loop device (direct I/O) over nbdfuse over each NBD export of %s; the data loaded without a budget, then the filesystem remounted and the kernel's caches dropped; the budget (memory cgroup v%d) holds the application (the %s server with shared_buffers 16MB; fio) and the page cache it fills; pd3: memory node in its own process, %s host cache outside the budget, like the peers' memory",
			units.FormatSize(opt.Size), memcg.Version(), pgName, units.FormatSize(opt.Cache)),
		fmt.Sprintf("pg-scan: SELECT sum(abalance) FROM pgbench_accounts (a sequential scan of the table) three times, the median's rows/s (ms in its column); pg-select: pgbench -S; pg-tpcb: pgbench (TPC-B); pgbench scale %d, %d clients, %v per run; fio: %s on a %s file; integrity: pg_amcheck --heapallindexed and e2fsck -fn after every run", opt.Scale, opt.Clients, opt.Duration, fioRun, units.FormatSize(opt.FioSize)),
		fmt.Sprintf("sqlite: a table of %d rows of 1 KiB loaded with no budget; sqlite-point: random lookups by key from one Python process (sqlite3 module) for %v; sqlite-scan: SELECT sum(length(v)) over the table, three times, the median; PRAGMA integrity_check after the run; on the block systems the database is on their ext4, on pd3-mount and bindfs on the mount", opt.SqliteRows, opt.Duration),
		treeNote(opt.TreeFiles),
		"accuracy: prefetched pages the host took / pages placed (in the Loading Zone or, after NBD stream reads, in the host's read-ahead windows); coverage: host misses served by either / host misses")
	if opt.Rounds > 1 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("each row is its system's median run of %d, the systems taking turns in fresh processes; \"runs ops/s\" is the spread; ratios are of the medians", opt.Rounds))
	}
	return rep, nil
}

func budgetName(b uint64) string {
	if b == 0 {
		return "nolimit"
	}
	return units.FormatSize(b)
}

// findPostgres returns the newest PostgreSQL bin directory.
func findPostgres() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	if len(dirs) == 0 {
		return "", errors.New("PostgreSQL is not installed (apt-get install postgresql postgresql-contrib)")
	}
	slices.SortFunc(dirs, func(a, b string) int {
		x, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		y, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return cmp.Compare(x, y)
	})
	bin := dirs[len(dirs)-1]
	if _, err := exec.LookPath("pgbench"); err != nil {
		return "", errors.New("pgbench is not installed (apt-get install postgresql-contrib)")
	}
	return bin, nil
}

var (
	tpsRe    = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)
	timingRe = regexp.MustCompile(`(?m)^Time: ([0-9.]+) ms`)
)

// fioFile is the file the fio workloads read, laid out with the data.
const fioFile = "fio.dat"

// runBlock sets sys up as a block device with ext4 on it, loads what the
// workloads read (pgbench's tables, fio's file) without a budget,
// remounts, and runs the workloads under budget (0: none), PostgreSQL
// inside the budget's cgroup; then checks the data. The results' configs
// name label, the budget the row belongs to (local runs without one in
// every budget's rows).
func runBlock(ctx context.Context, opt AppsOptions, bin, sys string, budget, label uint64, step func(string)) (_ []Result, err error) {
	needPG := slices.ContainsFunc(opt.Workloads, func(w string) bool { return strings.HasPrefix(w, "pg-") })
	needFio := slices.ContainsFunc(opt.Workloads, func(w string) bool { return strings.HasPrefix(w, "fio-") })
	needSqlite := slices.ContainsFunc(opt.Workloads, func(w string) bool { return strings.HasPrefix(w, "sqlite-") })
	needTree := slices.ContainsFunc(opt.Workloads, isTree)
	step("starting")
	st, err := startAppStack(ctx, opt, sys)
	if err != nil {
		return nil, err
	}
	defer st.close()
	var p *postgres
	running := false
	var g *memcg.Group
	defer func() {
		if running {
			p.kill()
		}
		if g == nil {
			return
		}
		if cerr := g.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	step("loading")
	if needPG {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		p = &postgres{bin: bin, data: filepath.Join(st.mnt, "pgdata"), sock: filepath.Join(st.dir, "sock"), port: strconv.Itoa(port)}
		for _, d := range []string{p.data, p.sock} {
			if err := os.Mkdir(d, 0o700); err != nil {
				return nil, err
			}
			if err := run("chown", "postgres:", d); err != nil {
				return nil, err
			}
		}
		if err := run("runuser", "-u", "postgres", "--", filepath.Join(bin, "initdb"), "-D", p.data); err != nil {
			return nil, err
		}
		if err := p.start(nil); err != nil {
			return nil, err
		}
		running = true
		if _, err := p.as(ctx, "pgbench", "-i", "-q", "-s", strconv.Itoa(opt.Scale), "postgres"); err != nil {
			return nil, err
		}
		if err := p.stop(); err != nil {
			return nil, err
		}
		running = false
	}
	if needFio {
		if _, err := runFioArgs(ctx, []string{"--name=layout", "--filename=" + filepath.Join(st.mnt, fioFile), "--size=" + strconv.FormatUint(opt.FioSize, 10),
			"--rw=write", "--bs=1M", "--ioengine=psync", "--end_fsync=1"}, nil); err != nil {
			return nil, err
		}
	}
	if needSqlite {
		if _, err := sqliteRun(nil, filepath.Join(st.mnt, sqliteFile), "load", strconv.Itoa(opt.SqliteRows)); err != nil {
			return nil, err
		}
	}
	if needTree {
		if err := writeTree(st.mnt, opt.TreeFiles); err != nil {
			return nil, err
		}
	}
	if err := st.remount(); err != nil {
		return nil, err
	}
	if budget > 0 {
		if g, err = memcg.New(fmt.Sprintf("pd3-apps-%d", os.Getpid()), budget); err != nil {
			return nil, err
		}
	}
	if needPG {
		if err := p.start(g); err != nil {
			return nil, err
		}
		running = true
	}
	out, err := runWorkloads(ctx, opt, st, g, p, st.mnt, sys, label, opt.Workloads, step)
	if err != nil {
		return nil, err
	}
	step("checking")
	integrity := "ok"
	if needPG {
		if _, err := p.as(ctx, filepath.Join(bin, "pg_amcheck"), "--install-missing", "--heapallindexed", "postgres"); err != nil {
			integrity = "amcheck failed: " + err.Error()
		}
		if err := p.stop(); err != nil {
			return nil, err
		}
		running = false
	}
	if needSqlite && integrity == "ok" {
		integrity = sqliteCheck(filepath.Join(st.mnt, sqliteFile))
	}
	if err := st.unmount(); err != nil {
		return nil, err
	}
	if err := run("e2fsck", "-fn", st.loop); err != nil && integrity == "ok" {
		integrity = "e2fsck: " + err.Error()
	}
	for i := range out {
		out[i].Integrity = integrity
	}
	return out, nil
}

// fioWorkload runs fio on the laid-out file inside g (nil: no budget),
// through the kernel's page cache as an application reads.
func fioWorkload(ctx context.Context, g *memcg.Group, file, w string, opt AppsOptions) (Result, error) {
	args := []string{"--output-format=json", "--name=" + w, "--filename=" + file, "--ioengine=psync", "--thread", "--group_reporting",
		"--runtime=" + strconv.Itoa(max(1, int(opt.Duration.Seconds()))), "--numjobs=4"}
	switch w {
	case "fio-zipf":
		args = append(args, "--size="+strconv.FormatUint(opt.FioSize, 10), "--rw=randread", "--bs=4k", "--random_distribution=zipf:1.1", "--norandommap")
	case "fio-seq4":
		q := strconv.FormatUint(opt.FioSize/4, 10)
		args = append(args, "--size="+q, "--offset_increment="+q, "--rw=read", "--bs=128k")
	default:
		return Result{}, fmt.Errorf("unknown workload %q", w)
	}
	if opt.FioIO > 0 {
		// fio's number_ios is ignored by time-based jobs and counts per
		// loop; io_size wraps around the region until that much is read.
		args = append(args, "--io_size="+strconv.FormatUint(opt.FioIO, 10))
	} else {
		args = append(args, "--time_based")
	}
	cmd := g.Command("fio", args...)
	return runFioCmd(cmd, w)
}

// pgWorkload runs one workload against a running server.
func pgWorkload(ctx context.Context, p *postgres, w string, opt AppsOptions) (Result, error) {
	secs := strconv.Itoa(max(1, int(opt.Duration.Seconds())))
	bench := func(extra ...string) (Result, error) {
		args := append([]string{"-c", strconv.Itoa(opt.Clients), "-j", strconv.Itoa(min(opt.Clients, 2)), "-T", secs}, extra...)
		out, err := p.as(ctx, "pgbench", append(args, "postgres")...)
		if err != nil {
			return Result{}, err
		}
		m := tpsRe.FindSubmatch(out)
		if m == nil {
			return Result{}, fmt.Errorf("pgbench printed no tps: %s", tail(out))
		}
		tps, _ := strconv.ParseFloat(string(m[1]), 64)
		return Result{OpsPerSec: tps, Ops: uint64(tps * opt.Duration.Seconds())}, nil
	}
	switch w {
	case "pg-select":
		return bench("-S")
	case "pg-tpcb":
		return bench()
	case "pg-scan":
		var ms []float64
		for range 3 {
			out, err := p.as(ctx, "psql", "-X", "-q", "-c", `\timing on`, "-c", "SELECT sum(abalance) FROM pgbench_accounts", "postgres")
			if err != nil {
				return Result{}, err
			}
			m := timingRe.FindSubmatch(out)
			if m == nil {
				return Result{}, fmt.Errorf("psql printed no timing: %s", tail(out))
			}
			v, _ := strconv.ParseFloat(string(m[1]), 64)
			ms = append(ms, v)
		}
		slices.Sort(ms)
		rows := float64(opt.Scale) * 100000
		return Result{Millis: ms[1], OpsPerSec: rows / (ms[1] / 1e3), Ops: uint64(3 * rows)}, nil
	}
	return Result{}, fmt.Errorf("unknown workload %q", w)
}

// appMeasured runs a workload and adds the export's CPU and memory and,
// for pd3, the host's counters over the run.
func appMeasured(ctx context.Context, st *appStack, fn func() (Result, error)) (Result, error) {
	var m0 map[string]float64
	if st.metrics != "" {
		var err error
		if m0, err = scrapeValues(ctx, st.metrics); err != nil {
			return Result{}, err
		}
	}
	r, err := measured(st.proc, st.nodes, "", "", fn)
	if err != nil {
		return r, err
	}
	if st.metrics != "" {
		m1, err := scrapeValues(ctx, st.metrics)
		if err != nil {
			return Result{}, err
		}
		r.Counters = delta(m0, m1)
	}
	return r, nil
}

// PrefetchAccuracy is the share of placed prefetches the host took (0
// where nothing was placed): the agent's (into the Loading Zone and the
// host's read-ahead windows), or Leap's (which proposes pages to the same
// transfer engine and Loading Zone).
func (r Result) PrefetchAccuracy() float64 {
	placed := r.Counters["prefetch_placed_total"] + r.Counters["cache_readahead_pages_total"]
	if placed == 0 {
		placed = r.Counters["leap_predicted_pages_total"]
	}
	if placed == 0 {
		return 0
	}
	return min(1, (r.Counters["prefetch_consumed_total"]+r.Counters["cache_readahead_hits_total"])/placed)
}

// sqliteFile is the database the sqlite workloads read.
const sqliteFile = "app.db"

// sqliteScript loads, reads and checks the sqlite database (Python's
// sqlite3 module: one process, no per-query process start).
const sqliteScript = `
import random, sqlite3, sys, time
db, mode = sys.argv[1], sys.argv[2]
c = sqlite3.connect(db)
if mode == "load":
    n = int(sys.argv[3])
    c.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
    rnd, batch = random.Random(1), []
    for i in range(1, n + 1):
        batch.append((i, rnd.randbytes(1000)))
        if len(batch) == 10000:
            c.executemany("INSERT INTO t VALUES(?, ?)", batch)
            batch = []
    c.executemany("INSERT INTO t VALUES(?, ?)", batch)
    c.commit()
elif mode == "point":
    n, secs = int(sys.argv[3]), float(sys.argv[4])
    rnd, cur, k = random.Random(), c.cursor(), 0
    t0 = time.monotonic()
    while True:
        for _ in range(100):
            cur.execute("SELECT v FROM t WHERE id = ?", (rnd.randint(1, n),)).fetchone()
        k += 100
        now = time.monotonic()
        if now - t0 >= secs:
            break
    print(k / (now - t0))
elif mode == "scan":
    t0 = time.monotonic()
    c.execute("SELECT sum(length(v)) FROM t").fetchone()
    print((time.monotonic() - t0) * 1000)
elif mode == "check":
    print(c.execute("PRAGMA integrity_check").fetchone()[0])
`

// sqliteRun runs the script on db in g (nil: no budget) and returns what
// it printed.
func sqliteRun(g *memcg.Group, db string, args ...string) (string, error) {
	full := append([]string{"-c", sqliteScript, db}, args...)
	cmd := g.Command("python3", full...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("sqlite %s: %w: %s", args[0], err, tail(out))
	}
	return strings.TrimSpace(string(out)), nil
}

// sqliteWorkload runs sqlite-point or sqlite-scan in g.
func sqliteWorkload(g *memcg.Group, db, w string, opt AppsOptions) (Result, error) {
	switch w {
	case "sqlite-point":
		out, err := sqliteRun(g, db, "point", strconv.Itoa(opt.SqliteRows), strconv.FormatFloat(opt.Duration.Seconds(), 'f', 1, 64))
		if err != nil {
			return Result{}, err
		}
		v, err := strconv.ParseFloat(out, 64)
		if err != nil {
			return Result{}, fmt.Errorf("sqlite point: unreadable output %q", out)
		}
		return Result{OpsPerSec: v, Ops: uint64(v * opt.Duration.Seconds())}, nil
	case "sqlite-scan":
		var ms []float64
		for range 3 {
			out, err := sqliteRun(g, db, "scan")
			if err != nil {
				return Result{}, err
			}
			v, err := strconv.ParseFloat(out, 64)
			if err != nil {
				return Result{}, fmt.Errorf("sqlite scan: unreadable output %q", out)
			}
			ms = append(ms, v)
		}
		slices.Sort(ms)
		rows := float64(opt.SqliteRows)
		return Result{Millis: ms[1], OpsPerSec: rows / (ms[1] / 1e3), Ops: uint64(3 * rows)}, nil
	}
	return Result{}, fmt.Errorf("unknown workload %q", w)
}

// runFS runs the file workloads (sqlite, fio) on a filesystem system: the
// data is written with no budget, the kernel's caches dropped, and the
// workloads run under budget (0: none); then the database is checked.
func runFS(ctx context.Context, opt AppsOptions, sys string, budget, label uint64, step func(string)) (_ []Result, err error) {
	step("starting")
	file, proc, nodes, stop, err := startFUSESystem(ctx, FUSEOptions{Exe: opt.Exe, Size: opt.Size, Cache: opt.Cache}, fsSystems[sys])
	if err != nil {
		return nil, err
	}
	defer stop()
	dir := filepath.Dir(file)
	st := &appStack{proc: proc, nodes: nodes}
	if proc != nil {
		st.metrics = proc.Addrs["metrics"] // the pd3 mount's
	}
	var works []string
	for _, w := range opt.Workloads {
		if !strings.HasPrefix(w, "pg-") {
			works = append(works, w)
		}
	}
	step("loading")
	for _, w := range works {
		if strings.HasPrefix(w, "sqlite-") {
			if _, err := sqliteRun(nil, filepath.Join(dir, sqliteFile), "load", strconv.Itoa(opt.SqliteRows)); err != nil {
				return nil, err
			}
			break
		}
	}
	for _, w := range works {
		if strings.HasPrefix(w, "fio-") {
			if _, err := runFioArgs(ctx, []string{"--name=layout", "--filename=" + filepath.Join(dir, fioFile), "--size=" + strconv.FormatUint(opt.FioSize, 10),
				"--rw=write", "--bs=1M", "--ioengine=psync", "--end_fsync=1"}, nil); err != nil {
				return nil, err
			}
			break
		}
	}
	if slices.ContainsFunc(works, isTree) {
		if err := writeTree(dir, opt.TreeFiles); err != nil {
			return nil, err
		}
	}
	dropCaches()
	var g *memcg.Group
	if budget > 0 {
		if g, err = memcg.New(fmt.Sprintf("pd3-apps-%d", os.Getpid()), budget); err != nil {
			return nil, err
		}
		defer func() {
			if cerr := g.Close(); cerr != nil && err == nil {
				err = cerr
			}
		}()
	}
	out, err := runWorkloads(ctx, opt, st, g, nil, dir, sys, label, works, step)
	if err != nil {
		return nil, err
	}
	step("checking")
	integrity := "ok"
	if slices.ContainsFunc(works, func(w string) bool { return strings.HasPrefix(w, "sqlite-") }) {
		integrity = sqliteCheck(filepath.Join(dir, sqliteFile))
	}
	for i := range out {
		out[i].Integrity = integrity
	}
	return out, nil
}

// runWorkloads runs each workload in g (nil: no budget) against the data
// in dir (PostgreSQL through p), measuring the export's processes; the
// rows are sys's at budget label.
func runWorkloads(ctx context.Context, opt AppsOptions, st *appStack, g *memcg.Group, p *postgres, dir, sys string, label uint64, works []string, step func(string)) ([]Result, error) {
	var out []Result
	for _, w := range works {
		step(w)
		if w == "fio-zipf" && opt.FioWarmup > 0 {
			warm := opt
			warm.Duration, warm.FioIO = opt.FioWarmup, 0
			if _, err := fioWorkload(ctx, g, filepath.Join(dir, fioFile), w, warm); err != nil {
				return nil, fmt.Errorf("%s warm-up: %w", w, err)
			}
		}
		r, err := appMeasured(ctx, st, func() (Result, error) {
			switch {
			case strings.HasPrefix(w, "pg-"):
				return pgWorkload(ctx, p, w, opt)
			case strings.HasPrefix(w, "sqlite-"):
				return sqliteWorkload(g, filepath.Join(dir, sqliteFile), w, opt)
			case isTree(w):
				return treeWorkload(g, dir, w, opt.TreeFiles)
			}
			return fioWorkload(ctx, g, filepath.Join(dir, fioFile), w, opt)
		})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", w, err)
		}
		r.System, r.Config = sys, w+"@"+budgetName(label)
		if g != nil {
			r.BudgetPeak = g.Peak()
		}
		out = append(out, r)
	}
	return out, nil
}

// sqliteCheck is "ok" when sqlite's integrity check of db passes, else
// what it said.
func sqliteCheck(db string) string {
	if res, err := sqliteRun(nil, db, "check"); err != nil || res != "ok" {
		return fmt.Sprintf("sqlite integrity_check: %s %v", res, err)
	}
	return "ok"
}
