package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"
)

// startNbdkit starts nbdkit on a free loopback port with args (filters,
// plugin and its parameters) and waits until it accepts connections. env
// is added to nbdkit's environment (TMPDIR for the cache filter's file).
func startNbdkit(ctx context.Context, env []string, args ...string) (*Child, string, error) {
	exe, err := exec.LookPath("nbdkit")
	if err != nil {
		return nil, "", fmt.Errorf("nbdkit is not installed (make deps-system)")
	}
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.CommandContext(ctx, exe, append([]string{"-f", "-i", "127.0.0.1", "-p", strconv.Itoa(port)}, args...)...)
	cmd.Stderr = os.Stderr
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	c := adoptChild(cmd)
	for i := 0; ; i++ {
		if nc, err := net.Dial("tcp", addr); err == nil {
			nc.Close()
			return c, addr, nil
		}
		if i > 400 {
			c.Stop()
			return nil, "", fmt.Errorf("nbdkit %v did not listen on %s", args, addr)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// startNbdkitCacheChain starts the remote-cache peer: nbdkit's memory
// plugin as the "memory node" and, in front of it, nbdkit's cache filter
// over its nbd plugin, with the cache file in RAM (/dev/shm) and 4 KiB
// blocks, so the front holds cache bytes of the remote's data.
// readahead puts nbdkit's readahead filter above the cache. It returns the
// front (the process clients talk to), the remote and the front's address.
func startNbdkitCacheChain(ctx context.Context, size, cache uint64, readahead bool) (front, remote *Child, addr string, err error) {
	remote, raddr, err := startNbdkit(ctx, nil, "memory", strconv.FormatUint(size, 10))
	if err != nil {
		return nil, nil, "", err
	}
	var args []string
	if readahead {
		args = append(args, "--filter=readahead")
	}
	args = append(args, "--filter=cache", "nbd", "uri=nbd://"+raddr+"/",
		"cache-max-size="+strconv.FormatUint(cache, 10), "cache-on-read=true", "cache-min-block-size=4K")
	front, addr, err = startNbdkit(ctx, []string{"TMPDIR=/dev/shm"}, args...)
	if err != nil {
		remote.Stop()
		return nil, nil, "", err
	}
	return front, remote, addr, nil
}
