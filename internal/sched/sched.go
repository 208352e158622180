// Package sched puts a serving process's threads in the kernel's batch
// scheduling class (SCHED_BATCH), so that a request handed from one pd3
// process to another on the same cores does not preempt its sender
// (docs/decisions.md, 47).
//
// A woken SCHED_BATCH thread does not preempt the thread running on its
// CPU: it runs on an idle CPU at once, and on a busy one when the running
// thread blocks or its slice ends. On a machine with idle cores nothing
// changes. On cores shared by a client, a host and its memory nodes, each
// request otherwise moves the CPU to the process it wakes, so every
// process handles its requests one at a time; without the preemption a
// sender goes on to its next requests and the receiver finds them
// together.
package sched

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Batch moves every thread of the process that runs in the normal class
// (SCHED_OTHER) to SCHED_BATCH, keeping its nice value. Threads started
// later inherit the class of the thread that starts them, so once every
// thread is moved the process stays there. A thread in another class (an
// operator's chrt) is left as it is. It returns how many threads it
// moved.
func Batch() (int, error) {
	moved := 0
	// The Go runtime may start a thread from one not yet moved while the
	// list is read; a pass that moves nothing has seen every thread.
	for range 16 {
		n, err := movePass(unix.SCHED_NORMAL, unix.SCHED_BATCH)
		moved += n
		if err != nil || n == 0 {
			return moved, err
		}
	}
	return moved, nil
}

// movePass moves every thread of the process in class from to class to,
// once over the list of threads.
func movePass(from, to uint32) (int, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0, fmt.Errorf("sched: listing the process's threads: %w", err)
	}
	moved := 0
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ok, err := moveThread(tid, from, to)
		if err != nil {
			return moved, err
		}
		if ok {
			moved++
		}
	}
	return moved, nil
}

// moveThread moves thread tid to class to if it runs in class from,
// keeping its nice value; it reports whether it moved it.
func moveThread(tid int, from, to uint32) (bool, error) {
	a, err := unix.SchedGetAttr(tid, 0)
	if errors.Is(err, unix.ESRCH) {
		return false, nil // it exited
	}
	if err != nil {
		return false, fmt.Errorf("sched: reading thread %d's scheduling class: %w", tid, err)
	}
	if a.Policy != from {
		return false, nil
	}
	set := unix.SchedAttr{Policy: to, Nice: a.Nice, Flags: a.Flags & unix.SCHED_FLAG_RESET_ON_FORK}
	if err := unix.SchedSetAttr(tid, &set, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return false, nil
		}
		return false, fmt.Errorf("sched: moving thread %d from scheduling class %d to %d: %w", tid, from, to, err)
	}
	return true, nil
}

// Policy is thread tid's scheduling class (unix.SCHED_*; 0 is the
// calling thread).
func Policy(tid int) (uint32, error) {
	a, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		return 0, fmt.Errorf("sched: reading thread %d's scheduling class: %w", tid, err)
	}
	return a.Policy, nil
}
