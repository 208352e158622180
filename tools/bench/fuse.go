package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
	// Progress, if set, is told each system's fill and jobs.
	Progress Progress
}

// FUSESystems are the ways to expose memory as a file that FUSE compares:
// pd3 (memory node, 64 MiB host cache, agent), pd3 without prefetching
// (--dpu none), nbdfuse over nbdkit's memory plugin, and tmpfs (the local
// limit: the data in this machine's memory). pd3-cached is pd3 with a host
// cache larger than the file, which the layout leaves holding all of it:
// every FUSE READ a host hit, no memory-node hop — the ceiling of pd3's
// FUSE path at any cache size.
var FUSESystems = []string{"pd3", "pd3-noprefetch", "nbdfuse-nbdkit", "tmpfs", "pd3-cached"}

// FUSEJobs name fio runs as pattern-engine-depth-direct.
var FUSEJobs = []string{
	"randread-psync-1-direct", "randread-libaio-16-direct",
	"randread-psync-1-buffered", "randread-libaio-16-buffered",
	"seqread1m-psync-1-buffered", "seqread1m-psync-1-direct",
}

// fuseJobArgs turns a job name into fio options.
func fuseJobArgs(job string) ([]string, error) {
	f := strings.Split(job, "-")
	if len(f) != 4 {
		return nil, fmt.Errorf("bad FUSE job %q (want pattern-engine-depth-direct|buffered)", job)
	}
	args := []string{"--ioengine=" + f[1], "--iodepth=" + f[2]}
	switch f[0] {
	case "randread":
		args = append(args, "--rw=randread", "--bs=4k")
	case "seqread1m":
		args = append(args, "--rw=read", "--bs=1M")
	default:
		return nil, fmt.Errorf("bad FUSE job pattern %q", f[0])
	}
	switch f[3] {
	case "direct":
		args = append(args, "--direct=1")
	case "buffered":
		args = append(args, "--direct=0")
	default:
		return nil, fmt.Errorf("bad FUSE job mode %q", f[3])
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
	iops, err := runSuite(rep, opt.Progress, opt.Systems, opt.Jobs, func(sys string) (suiteSystem, error) {
		file, proc, node, stop, err := startFUSESystem(ctx, opt, sys)
		if err != nil {
			return suiteSystem{}, err
		}
		base := []string{"--name=pd3", "--filename=" + file, "--size=" + strconv.FormatUint(opt.Size, 10), "--thread"}
		return suiteSystem{
			proc: proc, node: node, stop: stop,
			fill: func() error {
				_, err := runFioArgs(ctx, append(base, "--rw=write", "--bs=1M", "--ioengine=psync", "--end_fsync=1"), nil)
				return err
			},
			run: func(job string) (Result, error) {
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
		for _, base := range []string{"nbdfuse-nbdkit", "tmpfs", "pd3-noprefetch", "pd3-cached"} {
			if iops["pd3"][job] > 0 && iops[base][job] > 0 {
				rep.Ratios["pd3/"+base+"@"+job] = iops["pd3"][job] / iops[base][job]
			}
		}
		if iops["pd3-cached"][job] > 0 && iops["nbdfuse-nbdkit"][job] > 0 {
			rep.Ratios["pd3-cached/nbdfuse-nbdkit@"+job] = iops["pd3-cached"][job] / iops["nbdfuse-nbdkit"][job]
		}
	}
	rep.Notes = append(rep.Notes, fmt.Sprintf("fio on a %s file, %v per job, kernel page cache dropped before each; pd3: memory node in its own process, %s host cache; nbdkit memory holds the data in its own memory",
		units.FormatSize(opt.Size), opt.Runtime, units.FormatSize(opt.Cache)))
	return rep, nil
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
func startFUSESystem(ctx context.Context, opt FUSEOptions, sys string) (string, *Child, *Child, func(), error) {
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
	case "pd3", "pd3-noprefetch", "pd3-cached":
		node, err := StartChild(ctx, opt.Exe, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0")
		if err != nil {
			cleanup()
			return "", nil, nil, nil, err
		}
		dpu, cache := "embedded", opt.Cache
		switch sys {
		case "pd3-noprefetch":
			dpu = "none"
		case "pd3-cached":
			cache = opt.Size + 64<<20 // the file, the metadata and room to spare
		}
		host, err := StartChild(ctx, opt.Exe, nil, "serve", "--memnode", node.Addrs["memory node"], "--mount", mnt,
			"--volume", "disk0:4MiB", "--cache", strconv.FormatUint(cache, 10), "--nbd", "", "--page", "", "--dpu", dpu)
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
		return filepath.Join(mnt, "bench"), host, node, stop, nil
	case "nbdfuse-nbdkit":
		for _, bin := range []string{"nbdkit", "nbdfuse"} {
			if _, err := exec.LookPath(bin); err != nil {
				cleanup()
				return "", nil, nil, nil, fmt.Errorf("%s is not installed (make deps-system)", bin)
			}
		}
		// TCP on loopback, as pd3's host reaches its memory node.
		kitChild, addr, err := startNbdkit(ctx, nil, "memory", strconv.FormatUint(opt.Size, 10))
		if err != nil {
			cleanup()
			return "", nil, nil, nil, err
		}
		fuse := exec.CommandContext(ctx, "nbdfuse", filepath.Join(mnt, "bench"), "nbd://"+addr)
		fuse.Stderr = os.Stderr
		if err := fuse.Start(); err != nil {
			kitChild.Stop()
			cleanup()
			return "", nil, nil, nil, err
		}
		fuseChild := &Child{cmd: fuse, Pid: fuse.Process.Pid, Addrs: map[string]string{}}
		stop := func() {
			exec.Command("fusermount3", "-u", mnt).Run()
			fuseChild.Stop()
			kitChild.Stop()
			cleanup()
		}
		if err := waitMounted(mnt); err != nil {
			stop()
			return "", nil, nil, nil, err
		}
		return filepath.Join(mnt, "bench"), kitChild, nil, stop, nil
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
