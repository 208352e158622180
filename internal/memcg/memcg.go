// Package memcg holds processes, and the page cache they fill, to a memory
// budget with a memory cgroup: the setting in which a host's memory is
// smaller than its data. It speaks both hierarchies: v1 (the memory
// controller mounted at /sys/fs/cgroup/memory, memory.limit_in_bytes) and
// v2 (the unified hierarchy at /sys/fs/cgroup, memory.max).
//
// A process joins a group when it starts (Group.Command): the command runs
// under /bin/sh, which writes its own pid to the group's procs file and
// then execs the program, so the program and everything it forks are
// charged from their first page. Pages a process reads through the kernel
// page cache are charged to the group that first faulted them in; a group
// at its limit reclaims its own page cache first.
//
// Close removes the group; it fails while a process is still in it, so
// callers stop what they started first. Root is needed to create groups.
package memcg

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Roots of the two hierarchies.
const (
	v1Root = "/sys/fs/cgroup/memory"
	v2Root = "/sys/fs/cgroup"
)

// ErrUnsupported is returned when the machine has no memory cgroup that
// this process can use.
var ErrUnsupported = errors.New("memcg: no memory cgroup controller (v1 at " + v1Root + " or v2 at " + v2Root + ")")

// Group is one memory cgroup with a limit.
type Group struct {
	dir   string
	v2    bool
	limit uint64
}

// New creates the group name (a single path element) under the memory
// controller's root with a limit of limit bytes.
func New(name string, limit uint64) (*Group, error) {
	if name == "" || strings.ContainsRune(name, '/') {
		return nil, fmt.Errorf("memcg: bad group name %q", name)
	}
	if limit == 0 {
		return nil, fmt.Errorf("memcg: a limit of 0 bytes")
	}
	g := &Group{limit: limit}
	switch Version() {
	case 1:
		g.dir = filepath.Join(v1Root, name)
	case 2:
		g.dir, g.v2 = filepath.Join(v2Root, name), true
	default:
		return nil, ErrUnsupported
	}
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		return nil, fmt.Errorf("memcg: creating %s: %w (run as root)", g.dir, err)
	}
	file, val := "memory.limit_in_bytes", strconv.FormatUint(limit, 10)
	if g.v2 {
		file = "memory.max"
	}
	if err := g.write(file, val); err != nil {
		os.Remove(g.dir)
		return nil, err
	}
	if g.v2 {
		// Without swap a v2 group would otherwise also use memory.swap.max;
		// 0 keeps the budget a budget of RAM. Not every kernel has the file.
		_ = g.write("memory.swap.max", "0")
	}
	return g, nil
}

// Version is the hierarchy New creates groups in: 1 where the v1 memory
// controller is mounted, else 2 where the unified hierarchy has the
// memory controller, else 0 (New returns ErrUnsupported).
func Version() int {
	switch {
	case exists(filepath.Join(v1Root, "memory.limit_in_bytes")):
		return 1
	case v2Memory():
		return 2
	}
	return 0
}

// v2Memory reports whether the unified hierarchy has the memory controller
// available to children of its root (enabling it there if it can).
func v2Memory() bool {
	b, err := os.ReadFile(filepath.Join(v2Root, "cgroup.controllers"))
	if err != nil || !strings.Contains(" "+string(b)+" ", " memory") {
		return false
	}
	sub := filepath.Join(v2Root, "cgroup.subtree_control")
	if b, err := os.ReadFile(sub); err == nil && strings.Contains(string(b), "memory") {
		return true
	}
	return os.WriteFile(sub, []byte("+memory"), 0) == nil
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func (g *Group) write(file, val string) error {
	if err := os.WriteFile(filepath.Join(g.dir, file), []byte(val), 0); err != nil {
		return fmt.Errorf("memcg: setting %s of %s to %s: %w", file, g.dir, val, err)
	}
	return nil
}

// Dir is the group's directory.
func (g *Group) Dir() string { return g.dir }

// Limit is the group's limit in bytes.
func (g *Group) Limit() uint64 { return g.limit }

// Version is 1 or 2, the hierarchy the group lives in.
func (g *Group) Version() int {
	if g.v2 {
		return 2
	}
	return 1
}

// Command returns a command that runs name with args inside the group;
// a nil group runs it outside any (no budget).
func (g *Group) Command(name string, args ...string) *exec.Cmd {
	if g == nil {
		return exec.Command(name, args...)
	}
	return exec.Command("/bin/sh", append([]string{"-c", `echo $$ > "$0" && exec "$@"`, filepath.Join(g.dir, "cgroup.procs"), name}, args...)...)
}

// Shell returns the shell words that run a command inside the group, for
// a person to paste: the same wrapper as Command.
func (g *Group) Shell() string {
	return fmt.Sprintf(`sh -c 'echo $$ > %s && exec "$@"' sh`, filepath.Join(g.dir, "cgroup.procs"))
}

// Usage is the memory charged to the group now, page cache included.
func (g *Group) Usage() uint64 {
	if g.v2 {
		return g.readUint("memory.current")
	}
	return g.readUint("memory.usage_in_bytes")
}

// Peak is the most memory ever charged to the group (0 where the kernel
// does not say).
func (g *Group) Peak() uint64 {
	if g.v2 {
		return g.readUint("memory.peak")
	}
	return g.readUint("memory.max_usage_in_bytes")
}

func (g *Group) readUint(file string) uint64 {
	b, err := os.ReadFile(filepath.Join(g.dir, file))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// Procs lists the pids in the group.
func (g *Group) Procs() []int {
	b, err := os.ReadFile(filepath.Join(g.dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// Close removes the group. Processes still in it make it fail (after a
// short wait for exiting ones to leave); their pids are in the error.
func (g *Group) Close() error {
	var err error
	for i := 0; i < 50; i++ {
		if err = os.Remove(g.dir); err == nil || os.IsNotExist(err) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("memcg: removing %s (processes %v still in it): %w", g.dir, g.Procs(), err)
}
