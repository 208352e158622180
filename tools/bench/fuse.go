package bench

import (
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
	"syscall"
	"time"

	"github.com/pd3-go/pd3/internal/units"
	"github.com/prometheus/procfs"
)

// FUSEOptions configure the FUSE benchmark.
type FUSEOptions struct {
	Exe     string
	Systems []string
	Jobs    []string
	Size    uint64
	Cache   uint64
	Runtime time.Duration
	// Rounds: as NBDOptions.Rounds.
	Rounds int
	// Progress, if set, is told each system's fill and jobs.
	Progress Progress
}

// FUSESystems are the ways to expose memory as a file that FUSE compares:
// pd3 (memory node, 64 MiB host cache, agent), pd3 without prefetching
// (--dpu none), nbdfuse over the nbdkit cache chain (the fair remote peer:
// a 64 MiB cache in front of a second nbdkit holding the data, no
// prefetching), nbdfuse over nbdkit's memory plugin (all local), bindfs
// over tmpfs (a plain passthrough FUSE filesystem: the local ceiling of a
// FUSE file system) and tmpfs (no FUSE at all). pd3-cached is pd3 with a
// host cache larger than the file: every FUSE READ a host hit, the
// ceiling of pd3's FUSE path at any cache size. pd3-oracle is pd3-cached
// without the agent whose every read also fetches its pages from the
// memory node, unwaited (--shadow-reads): a prefetcher that never lets a
// read wait and pays each page's transfer.
// go-fuse-nbdkit is a Go FUSE server that only relays each request to
// nbdkit memory (ServeFUSERelay): the ceiling of a miss through a Go FUSE
// server, one hop from its data.
var FUSESystems = []string{"pd3", "pd3-noprefetch", "nbdfuse-cache-nbd", "nbdfuse-nbdkit", "go-fuse-nbdkit", "bindfs", "tmpfs", "pd3-cached", "pd3-oracle", "pd3-r1", "pd3-r2"}

// fuseDefaultSystems leave out pd3's own variants.
var fuseDefaultSystems = []string{"pd3", "nbdfuse-cache-nbd", "nbdfuse-nbdkit", "go-fuse-nbdkit", "bindfs", "tmpfs"}

// FUSEDefaultSystems is what pd3 bench fuse compares unless told.
func FUSEDefaultSystems() []string { return slices.Clone(fuseDefaultSystems) }

// FUSEJobs name the runs: fio as PATTERN-ENGINE-DEPTH-direct|buffered
// with an optional -JOBS (threads), dbench-CLIENTS, and files-OP (one
// metadata operation timed on 2000 files: create, write4k, stat, rename,
// unlink; not run unless asked for).
var FUSEJobs = []string{
	"seqread1m-psync-1-direct", "seqread1m-psync-1-buffered",
	"randread-psync-1-direct", "randread-psync-1-direct-4",
	"seqwrite1m-psync-1-buffered", "dbench-2",
}

// fuseJobArgs turns a fio job name into fio options (dbench jobs: nil).
func fuseJobArgs(job string) ([]string, error) {
	if _, ok, err := fileOp(job); ok {
		return nil, err
	}
	if n, ok := strings.CutPrefix(job, "dbench-"); ok {
		if c, err := strconv.Atoi(n); err != nil || c < 1 {
			return nil, fmt.Errorf("bad FUSE job %q (want dbench-CLIENTS)", job)
		}
		return nil, nil
	}
	f := strings.Split(job, "-")
	if len(f) != 4 && len(f) != 5 {
		return nil, fmt.Errorf("bad FUSE job %q (want pattern-engine-depth-direct|buffered[-jobs] or dbench-clients)", job)
	}
	args := []string{"--ioengine=" + f[1], "--iodepth=" + f[2]}
	switch f[0] {
	case "randread":
		args = append(args, "--rw=randread", "--bs=4k")
	case "seqread1m":
		args = append(args, "--rw=read", "--bs=1M")
	case "seqwrite1m":
		// What a writer that wants its data safe does: fsync at the end.
		args = append(args, "--rw=write", "--bs=1M", "--end_fsync=1")
	case "seqwrite4k":
		// A log or database appending small records: each write(2)
		// is a system call into the kernel's cache, which a mount
		// that made the kernel ask it something per write slows.
		args = append(args, "--rw=write", "--bs=4k", "--end_fsync=1")
	case "commit4k":
		// A database committing a page at a time: a 4 KiB overwrite
		// at a random offset, then fsync, again and again.
		args = append(args, "--rw=randwrite", "--bs=4k", "--fsync=1")
	default:
		return nil, fmt.Errorf("bad FUSE job pattern %q (randread, seqread1m, seqwrite1m, seqwrite4k, commit4k)", f[0])
	}
	switch f[3] {
	case "direct":
		args = append(args, "--direct=1")
	case "buffered":
		args = append(args, "--direct=0")
	default:
		return nil, fmt.Errorf("bad FUSE job mode %q", f[3])
	}
	if len(f) == 5 {
		n, err := strconv.Atoi(f[4])
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad FUSE job thread count %q", f[4])
		}
		args = append(args, "--numjobs="+f[4], "--group_reporting")
	}
	return args, nil
}

// FUSE lays out a file on each system, then runs each job with the kernel
// page cache dropped before it, and reports IOPS (and GB/s) with ratios.
func FUSE(ctx context.Context, opt FUSEOptions) (*Report, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("bench fuse needs root (mounts, drop_caches)")
	}
	if _, err := exec.LookPath("fio"); err != nil {
		return nil, errors.New("fio is not installed (make deps-system)")
	}
	for _, job := range opt.Jobs {
		if _, err := fuseJobArgs(job); err != nil {
			return nil, err
		}
	}
	rep := &Report{Bench: "fuse", Machine: Machine(), Ratios: map[string]float64{}}
	iops, err := runSuite(rep, opt.Progress, opt.Rounds, opt.Systems, opt.Jobs, func(sys string) (suiteSystem, error) {
		file, proc, nodes, stop, err := startFUSESystem(ctx, opt, sys)
		if err != nil {
			return suiteSystem{}, err
		}
		base := []string{"--name=pd3", "--filename=" + file, "--size=" + strconv.FormatUint(opt.Size, 10), "--thread"}
		return suiteSystem{
			proc: proc, nodes: nodes, stop: stop,
			fill: func() error {
				_, err := runFioArgs(ctx, append(base, "--rw=write", "--bs=1M", "--ioengine=psync", "--end_fsync=1"), nil)
				return err
			},
			run: func(job string) (Result, error) {
				if clients, ok := strings.CutPrefix(job, "dbench-"); ok {
					if oneFile(sys) {
						return Result{}, errSkip // one file, not a filesystem
					}
					return runDbench(ctx, filepath.Join(filepath.Dir(file), "dbench"), clients, opt.Runtime)
				}
				if op, ok, _ := fileOp(job); ok {
					if oneFile(sys) {
						return Result{}, errSkip
					}
					return runFileOps(filepath.Join(filepath.Dir(file), "files"), op)
				}
				args, _ := fuseJobArgs(job) // checked above
				dropCaches()
				return runFioArgs(ctx, append(append(base, args...), "--time_based", "--runtime="+strconv.Itoa(int(opt.Runtime.Seconds())), "--norandommap", "--randrepeat=0"), nil)
			},
		}, nil
	})
	if err != nil {
		return nil, err
	}
	for _, job := range opt.Jobs {
		for _, base := range []string{"nbdfuse-cache-nbd", "nbdfuse-nbdkit", "go-fuse-nbdkit", "bindfs", "tmpfs", "pd3-noprefetch", "pd3-cached"} {
			if iops["pd3"][job] > 0 && iops[base][job] > 0 {
				rep.Ratios["pd3/"+base+"@"+job] = iops["pd3"][job] / iops[base][job]
			}
		}
		// What the ceiling itself reaches against the fair peer: a goal
		// above it is out of reach of any Go FUSE server one hop from
		// its data here.
		if iops["go-fuse-nbdkit"][job] > 0 && iops["nbdfuse-cache-nbd"][job] > 0 {
			rep.Ratios["go-fuse-nbdkit/nbdfuse-cache-nbd@"+job] = iops["go-fuse-nbdkit"][job] / iops["nbdfuse-cache-nbd"][job]
		}
		if iops["pd3-r1"][job] > 0 && iops["pd3-r2"][job] > 0 {
			rep.Ratios["pd3-r2/pd3-r1@"+job] = iops["pd3-r2"][job] / iops["pd3-r1"][job]
		}
	}
	rep.Notes = append(rep.Notes, fmt.Sprintf("fio on a %s file, %v per job, kernel page cache dropped before each; pd3: memory node in its own process, %s host cache; the nbdkit cache chain: %s cache in /dev/shm in front of a second nbdkit holding the data; dbench: MB/s in the ops/s column; files-OP: 2000 files one at a time, p50/p99 per operation; nbdfuse (one file, no filesystem) skipped for both",
		units.FormatSize(opt.Size), opt.Runtime, units.FormatSize(opt.Cache), units.FormatSize(opt.Cache)))
	return rep, nil
}

// oneFile reports whether sys mounts one file, not a filesystem (no
// dbench, no metadata jobs).
func oneFile(sys string) bool { return strings.HasPrefix(sys, "nbdfuse") || sys == "go-fuse-nbdkit" }

// runDbench runs dbench with clients processes in dir (created) for d and
// reports its throughput: MB/s as OpsPerSec (what the ratios compare).
func runDbench(ctx context.Context, dir, clients string, d time.Duration) (Result, error) {
	if _, err := exec.LookPath("dbench"); err != nil {
		return Result{}, errors.New("dbench is not installed: apt-get install dbench (make bench-fuse installs it)")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(dir)
	cctx, cancel := context.WithTimeout(ctx, d+2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(cctx, "dbench", "-D", dir, "-t", strconv.Itoa(max(1, int(d.Seconds()))), clients).CombinedOutput()
	if err != nil {
		return Result{}, fmt.Errorf("dbench: %w: %s", err, tail(out))
	}
	m := dbenchThroughput.FindSubmatch(out)
	if m == nil {
		return Result{}, fmt.Errorf("dbench printed no throughput: %s", tail(out))
	}
	mbs, _ := strconv.ParseFloat(string(m[1]), 64)
	return Result{Ops: uint64(mbs * d.Seconds()), OpsPerSec: mbs, GBytesPerSec: mbs / 1000}, nil
}

var dbenchThroughput = regexp.MustCompile(`Throughput ([0-9.]+) MB/sec`)

func tail(b []byte) string {
	if len(b) > 400 {
		b = b[len(b)-400:]
	}
	return string(b)
}

func dropCaches() {
	syscall.Sync()
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("1"), 0)
}

// waitMounted polls this process's mount table for dir.
func waitMounted(dir string) error {
	for i := 0; i < 600; i++ {
		ms, _ := procfs.GetMounts()
		for _, m := range ms {
			if m.MountPoint == dir {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not mounted after 30s", dir)
}

// startFUSESystem mounts a system and returns the file to test, the
// process to measure (nil for tmpfs), pd3's memory node (nil for the
// others) and a stop function.
func startFUSESystem(ctx context.Context, opt FUSEOptions, sys string) (string, *Child, Nodes, func(), error) {
	dir, err := os.MkdirTemp("", "pd3-fuse-bench-")
	if err != nil {
		return "", nil, nil, nil, err
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return "", nil, nil, nil, err
	}
	cleanup := func() {
		syscall.Unmount(mnt, syscall.MNT_DETACH)
		os.RemoveAll(dir)
	}
	switch sys {
	case "pd3", "pd3-noprefetch", "pd3-cached", "pd3-oracle":
		node, err := StartChild(ctx, opt.Exe, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0")
		if err != nil {
			cleanup()
			return "", nil, nil, nil, err
		}
		dpu, cache, extra := "embedded", opt.Cache, []string(nil)
		switch sys {
		case "pd3-noprefetch":
			dpu = "none"
		case "pd3-cached":
			cache = opt.Size + 64<<20 // the file, the metadata and room to spare
		case "pd3-oracle":
			dpu, cache, extra = "none", opt.Size+64<<20, []string{"--shadow-reads"}
		}
		host, err := StartChild(ctx, opt.Exe, []string{"metrics"}, append([]string{"serve", "--memnode", node.Addrs["memory node"], "--mount", mnt,
			"--volume", "disk0:4MiB", "--cache", strconv.FormatUint(cache, 10), "--nbd", "", "--page", "", "--dpu", dpu,
			"--metrics", "127.0.0.1:0"}, extra...)...)
		if err != nil {
			node.Stop()
			cleanup()
			return "", nil, nil, nil, err
		}
		stop := func() { host.Stop(); node.Stop(); cleanup() }
		if err := host.WaitOutput("mounted at", 30*time.Second); err != nil {
			stop()
			return "", nil, nil, nil, err
		}
		return filepath.Join(mnt, "bench"), host, Nodes{node}, stop, nil
	case "pd3-r1", "pd3-r2":
		// The filesystem over two memory nodes, in one copy or two.
		cs, _ := parseClusterSystem(sys)
		_, host, nodes, stop, err := startCluster(ctx, opt.Exe, opt.Cache, "4MiB", cs, "--mount", mnt)
		if err != nil {
			cleanup()
			return "", nil, nil, nil, err
		}
		return filepath.Join(mnt, "bench"), host, nodes, func() { stop(); cleanup() }, nil
	case "nbdfuse-nbdkit", "nbdfuse-cache-nbd":
		for _, bin := range []string{"nbdkit", "nbdfuse"} {
			if _, err := exec.LookPath(bin); err != nil {
				cleanup()
				return "", nil, nil, nil, fmt.Errorf("%s is not installed (make deps-system)", bin)
			}
		}
		// TCP on loopback, as pd3's host reaches its memory node.
		var kitChild, remote *Child
		var addr string
		var err error
		if sys == "nbdfuse-cache-nbd" {
			kitChild, remote, addr, err = startNbdkitCacheChain(ctx, opt.Size, opt.Cache, false)
		} else {
			kitChild, addr, err = startNbdkit(ctx, nil, "memory", strconv.FormatUint(opt.Size, 10))
		}
		if err != nil {
			cleanup()
			return "", nil, nil, nil, err
		}
		fuse := exec.CommandContext(ctx, "nbdfuse", filepath.Join(mnt, "bench"), "nbd://"+addr)
		fuse.Stderr = os.Stderr
		stopKit := func() {
			kitChild.Stop()
			if remote != nil {
				remote.Stop()
			}
		}
		if err := fuse.Start(); err != nil {
			stopKit()
			cleanup()
			return "", nil, nil, nil, err
		}
		fuseChild := adoptChild(fuse)
		stop := func() {
			exec.Command("fusermount3", "-u", mnt).Run()
			fuseChild.Stop()
			stopKit()
			cleanup()
		}
		if err := waitMounted(mnt); err != nil {
			stop()
			return "", nil, nil, nil, err
		}
		// The server measured is the one the FUSE daemon talks to; the
		// chain's remote plays the memory node.
		return filepath.Join(mnt, "bench"), kitChild, Nodes{remote}, stop, nil
	case "go-fuse-nbdkit":
		// The ceiling of a Go FUSE server one hop from its data:
		// ServeFUSERelay in a process of its own, nbdkit memory behind it.
		kit, addr, err := startNbdkit(ctx, nil, "memory", strconv.FormatUint(opt.Size, 10))
		if err != nil {
			cleanup()
			return "", nil, nil, nil, err
		}
		relay, err := StartChild(ctx, opt.Exe, nil, "bench", "fuse-relay", "--mount", mnt, "--forward", addr)
		if err != nil {
			kit.Stop()
			cleanup()
			return "", nil, nil, nil, err
		}
		stop := func() {
			relay.Stop() // unmounts
			exec.Command("fusermount3", "-u", mnt).Run()
			kit.Stop()
			cleanup()
		}
		if err := waitMounted(mnt); err != nil {
			stop()
			return "", nil, nil, nil, err
		}
		return filepath.Join(mnt, "bench"), relay, Nodes{kit}, stop, nil
	case "bindfs":
		if _, err := exec.LookPath("bindfs"); err != nil {
			cleanup()
			return "", nil, nil, nil, errors.New("bindfs is not installed (make deps-system)")
		}
		src := filepath.Join(dir, "src")
		if err := os.Mkdir(src, 0o755); err != nil {
			cleanup()
			return "", nil, nil, nil, err
		}
		size := strconv.FormatUint(opt.Size+256<<20, 10)
		if err := syscall.Mount("tmpfs", src, "tmpfs", 0, "size="+size); err != nil {
			cleanup()
			return "", nil, nil, nil, fmt.Errorf("mounting tmpfs: %w", err)
		}
		// -f: in the foreground, so the process is ours to measure and stop.
		b := exec.CommandContext(ctx, "bindfs", "-f", src, mnt)
		b.Stderr = os.Stderr
		stop := func() {
			exec.Command("fusermount3", "-u", mnt).Run()
			syscall.Unmount(src, syscall.MNT_DETACH)
			cleanup()
		}
		if err := b.Start(); err != nil {
			stop()
			return "", nil, nil, nil, err
		}
		bChild := adoptChild(b)
		stopAll := func() { exec.Command("fusermount3", "-u", mnt).Run(); bChild.Stop(); stop() }
		if err := waitMounted(mnt); err != nil {
			stopAll()
			return "", nil, nil, nil, err
		}
		return filepath.Join(mnt, "bench"), bChild, nil, stopAll, nil
	case "tmpfs":
		size := strconv.FormatUint(opt.Size+64<<20, 10)
		if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size="+size); err != nil {
			cleanup()
			return "", nil, nil, nil, fmt.Errorf("mounting tmpfs: %w", err)
		}
		return filepath.Join(mnt, "bench"), nil, nil, cleanup, nil
	}
	cleanup()
	return "", nil, nil, nil, fmt.Errorf("unknown FUSE system %q (have %v)", sys, FUSESystems)
}
