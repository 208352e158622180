// Package procstat reads a process's resident memory and CPU time, for
// benchmarks that report them per role (host, memory node, agent). It is a
// thin layer over prometheus/procfs, which parses /proc.
package procstat

import (
	"fmt"
	"time"

	"github.com/prometheus/procfs"
)

// proc opens pid's /proc entry (0: this process).
func proc(pid int) (procfs.Proc, error) {
	var p procfs.Proc
	var err error
	if pid == 0 {
		p, err = procfs.Self()
	} else {
		p, err = procfs.NewProc(pid)
	}
	if err != nil {
		return procfs.Proc{}, fmt.Errorf("procstat: pid %d: %w", pid, err)
	}
	return p, nil
}

func stat(pid int) (procfs.ProcStat, error) {
	p, err := proc(pid)
	if err != nil {
		return procfs.ProcStat{}, err
	}
	st, err := p.Stat()
	if err != nil {
		return procfs.ProcStat{}, fmt.Errorf("procstat: pid %d: %w", pid, err)
	}
	return st, nil
}

// RSS returns the resident set size of pid in bytes (0: this process).
func RSS(pid int) (uint64, error) {
	st, err := stat(pid)
	if err != nil {
		return 0, err
	}
	return uint64(st.ResidentMemory()), nil
}

// Private returns the resident memory of pid that is its own: anonymous
// and shared-memory pages, without the file-backed pages of its binary
// and libraries, which the page cache shares with other processes and may
// reclaim (0: this process). A memory node's stored bytes are its own
// pages; the text of a large binary (embedded etcd) is not.
func Private(pid int) (uint64, error) {
	p, err := proc(pid)
	if err != nil {
		return 0, err
	}
	st, err := p.NewStatus()
	if err != nil {
		return 0, fmt.Errorf("procstat: pid %d: %w", pid, err)
	}
	return st.RssAnon + st.RssShmem, nil
}

// CPU returns the user+system CPU time pid has used (0: this process).
func CPU(pid int) (time.Duration, error) {
	st, err := stat(pid)
	if err != nil {
		return 0, err
	}
	return time.Duration(st.CPUTime() * float64(time.Second)), nil
}
