// Package procstat reads a process's resident memory and CPU time, for
// benchmarks that report them per role (host, memory node, agent). It is a
// thin layer over prometheus/procfs, which parses /proc.
package procstat

import (
	"fmt"
	"time"

	"github.com/prometheus/procfs"
)

func stat(pid int) (procfs.ProcStat, error) {
	var p procfs.Proc
	var err error
	if pid == 0 {
		p, err = procfs.Self()
	} else {
		p, err = procfs.NewProc(pid)
	}
	if err != nil {
		return procfs.ProcStat{}, fmt.Errorf("procstat: pid %d: %w", pid, err)
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

// CPU returns the user+system CPU time pid has used (0: this process).
func CPU(pid int) (time.Duration, error) {
	st, err := stat(pid)
	if err != nil {
		return 0, err
	}
	return time.Duration(st.CPUTime() * float64(time.Second)), nil
}
