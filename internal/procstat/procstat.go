// Package procstat reads a process's resident memory and CPU time from
// /proc, for benchmarks that report them per role (host, memory node, agent).
package procstat

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// RSS returns the resident set size of pid in bytes (0: this process).
func RSS(pid int) (uint64, error) {
	b, err := os.ReadFile(path(pid, "status"))
	if err != nil {
		return 0, err
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if f, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			fs := strings.Fields(string(f))
			if len(fs) >= 1 {
				kb, err := strconv.ParseUint(fs[0], 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, fmt.Errorf("procstat: no VmRSS for pid %d", pid)
}

// CPU returns the user+system CPU time pid has used (0: this process).
func CPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(path(pid, "stat"))
	if err != nil {
		return 0, err
	}
	// Fields after the parenthesised command name; utime and stime are
	// fields 14 and 15 of the whole line.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("procstat: bad stat for pid %d", pid)
	}
	fs := strings.Fields(string(b[i+1:]))
	if len(fs) < 13 {
		return 0, fmt.Errorf("procstat: short stat for pid %d", pid)
	}
	u, err1 := strconv.ParseUint(fs[11], 10, 64)
	s, err2 := strconv.ParseUint(fs[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("procstat: bad cpu times for pid %d", pid)
	}
	// USER_HZ is 100 on every Linux ABI Go supports.
	return time.Duration(u+s) * (time.Second / 100), nil
}

func path(pid int, f string) string {
	if pid == 0 {
		return "/proc/self/" + f
	}
	return "/proc/" + strconv.Itoa(pid) + "/" + f
}
