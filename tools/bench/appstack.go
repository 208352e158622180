package bench

// The applications benchmark's stack: an export, ext4 on it through
// nbdfuse and a loop device, mounted; and a PostgreSQL server on it.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pd3-go/pd3/internal/memcg"
)

// appStack is an export with a filesystem on it, mounted: the system's
// processes, nbdfuse, the loop device and the mount, undone by close.
type appStack struct {
	proc     *Child
	nodes    Nodes
	metrics  string // the pd3 host's /metrics address, or ""
	dir, mnt string
	loop     string
	undo     []func()
}

func (s *appStack) close() {
	for _, f := range slices.Backward(s.undo) {
		f()
	}
	s.undo = nil
}

// startAppStack starts sys's export and puts ext4 on it through nbdfuse
// and a loop device with direct I/O (the kernel's page cache sits above
// the filesystem only, and only that counts in the budget).
func startAppStack(ctx context.Context, opt AppsOptions, sys string) (_ *appStack, err error) {
	s := &appStack{}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	s.dir, err = os.MkdirTemp("", "pd3-apps-")
	if err != nil {
		return nil, err
	}
	os.Chmod(s.dir, 0o755)
	s.undo = append(s.undo, func() { os.RemoveAll(s.dir) })
	size := strconv.FormatUint(opt.Size, 10)
	var uri string
	switch sys {
	case "local", "nbdkit-memory":
		c, addr, err := startNbdkit(ctx, nil, "memory", size)
		if err != nil {
			return nil, err
		}
		s.proc, uri = c, "nbd://"+addr
		s.undo = append(s.undo, c.Stop)
	case "relay":
		remote, raddr, err := startNbdkit(ctx, nil, "memory", size)
		if err != nil {
			return nil, err
		}
		s.undo = append(s.undo, remote.Stop)
		front, addr, err := startNbdkit(ctx, nil, "nbd", "uri=nbd://"+raddr+"/")
		if err != nil {
			return nil, err
		}
		s.undo = append(s.undo, front.Stop)
		s.proc, s.nodes, uri = front, Nodes{remote}, "nbd://"+addr
	case "pd3", "pd3-noagent", "pd3-leap", "pd3-cached", "pd3-oracle":
		node, err := StartChild(ctx, opt.Exe, []string{"memory node"}, append([]string{"memnode", "--listen", "127.0.0.1:0"}, opt.NodeArgs...)...)
		if err != nil {
			return nil, err
		}
		s.undo = append(s.undo, node.Stop)
		cache := opt.Cache
		if sys == "pd3-cached" || sys == "pd3-oracle" {
			cache = opt.Size + 64<<20
		}
		args := []string{"serve", "--memnode", node.Addrs["memory node"], "--volume", "disk0:" + size,
			"--cache", strconv.FormatUint(cache, 10), "--nbd", "127.0.0.1:0", "--page", "", "--metrics", "127.0.0.1:0"}
		switch sys {
		case "pd3", "pd3-cached":
			args = append(args, "--dpu", "embedded")
		case "pd3-noagent":
			args = append(args, "--dpu", "none")
		case "pd3-oracle":
			args = append(args, "--dpu", "none", "--shadow-reads")
		case "pd3-leap":
			args = append(args, "--dpu", "none", "--prefetch", "leap")
		}
		host, err := StartChild(ctx, opt.Exe, []string{"NBD server", "metrics"}, append(args, opt.PD3Args...)...)
		if err != nil {
			return nil, err
		}
		s.undo = append(s.undo, host.Stop)
		s.proc, s.nodes, s.metrics = host, Nodes{node}, host.Addrs["metrics"]
		uri = "nbd://" + host.Addrs["NBD server"] + "/disk0"
	default:
		return nil, fmt.Errorf("unknown system %q", sys)
	}
	fuseDir := filepath.Join(s.dir, "fuse")
	s.mnt = filepath.Join(s.dir, "mnt")
	for _, d := range []string{fuseDir, s.mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, err
		}
	}
	pidFile := filepath.Join(s.dir, "nbdfuse.pid")
	fuse := exec.Command("nbdfuse", "-P", pidFile, filepath.Join(fuseDir, "disk"), uri)
	fuse.Stderr = os.Stderr
	if err := fuse.Start(); err != nil {
		return nil, fmt.Errorf("starting nbdfuse: %w", err)
	}
	fuseDone := make(chan error, 1)
	go func() { fuseDone <- fuse.Wait() }()
	s.undo = append(s.undo, func() {
		exec.Command("fusermount3", "-u", fuseDir).Run()
		select {
		case <-fuseDone:
		case <-time.After(10 * time.Second):
			fuse.Process.Kill()
			<-fuseDone
		}
	})
	if err := waitFile(pidFile, fuseDone, 30*time.Second); err != nil {
		return nil, fmt.Errorf("nbdfuse on %s: %w", uri, err)
	}
	out, err := exec.Command("losetup", "--direct-io=on", "--find", "--show", filepath.Join(fuseDir, "disk")).Output()
	if err != nil {
		return nil, fmt.Errorf("losetup: %w", exitText(err))
	}
	s.loop = strings.TrimSpace(string(out))
	s.undo = append(s.undo, func() { exec.Command("losetup", "-d", s.loop).Run() })
	if err := run("mkfs.ext4", "-q", "-F", s.loop); err != nil {
		return nil, err
	}
	if err := s.mount(); err != nil {
		return nil, err
	}
	s.undo = append(s.undo, func() {
		if s.unmount() != nil {
			syscall.Unmount(s.mnt, syscall.MNT_DETACH) // let the loop device and nbdfuse go
		}
	})
	return s, nil
}

func (s *appStack) mount() error {
	if err := syscall.Mount(s.loop, s.mnt, "ext4", 0, ""); err != nil {
		return fmt.Errorf("mounting %s: %w", s.loop, err)
	}
	return nil
}

// unmount unmounts the filesystem. A server that has just exited may keep
// it busy for a moment (its last files closing), so EBUSY is retried for
// a few seconds.
func (s *appStack) unmount() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := syscall.Unmount(s.mnt, 0)
		switch {
		case err == nil || errors.Is(err, syscall.EINVAL): // EINVAL: not mounted
			return nil
		case errors.Is(err, syscall.EBUSY) && time.Now().Before(deadline):
			time.Sleep(50 * time.Millisecond)
		default:
			return fmt.Errorf("unmounting %s: %w", s.mnt, err)
		}
	}
}

// remount drops every cached page of the filesystem (and the kernel's
// other caches): the next reads reach the export.
func (s *appStack) remount() error {
	if err := s.unmount(); err != nil {
		return err
	}
	dropCaches()
	return s.mount()
}

// waitFile waits until path exists or the process behind exited ends.
func waitFile(path string, exited <-chan error, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("exited before it was ready: %v", err)
		case <-deadline.C:
			return fmt.Errorf("not ready within %v", timeout)
		case <-tick.C:
		}
	}
}

func run(name string, args ...string) error {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, tail(out))
	}
	return nil
}

func exitText(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, tail(ee.Stderr))
	}
	return err
}

// postgres is a PostgreSQL server on a data directory, reached over a
// unix socket.
type postgres struct {
	bin, data, sock string
	port            string
}

func (p *postgres) ctl(g *memcg.Group, args ...string) error {
	full := append([]string{"-u", "postgres", "--", filepath.Join(p.bin, "pg_ctl"), "-D", p.data}, args...)
	cmd := g.Command("runuser", full...)
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(p.sock, "server.log"))
		return fmt.Errorf("pg_ctl %s: %w: %s%s", args[len(args)-1], err, tail(out), tail(log))
	}
	return nil
}

// start starts the server inside g (nil: no budget).
func (p *postgres) start(g *memcg.Group) error {
	return p.ctl(g, "-w", "-l", filepath.Join(p.sock, "server.log"), "-o",
		"-p "+p.port+" -k "+p.sock+" -c listen_addresses='' -c shared_buffers=16MB", "start")
}

func (p *postgres) stop() error { return p.ctl(nil, "-m", "fast", "-w", "stop") }

func (p *postgres) kill() { p.ctl(nil, "-m", "immediate", "-w", "stop") }

// as runs a client program as postgres against the server.
func (p *postgres) as(ctx context.Context, name string, args ...string) ([]byte, error) {
	full := append([]string{"-u", "postgres", "--", name, "-h", p.sock, "-p", p.port, "-U", "postgres"}, args...)
	out, err := exec.CommandContext(ctx, "runuser", full...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s: %w: %s", filepath.Base(name), err, tail(out))
	}
	return out, nil
}
