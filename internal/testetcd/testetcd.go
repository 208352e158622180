// Package testetcd runs an etcd cluster of separate processes for tests —
// Debian's etcd-server (3.4), as an operator's existing control plane
// would be — on loopback, removed when the test ends. Tests are skipped
// where the etcd binary is not installed.
package testetcd

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/loopport"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Members are the etcd processes of one cluster.
type Members struct {
	Clients []string // client URL per member

	t     testing.TB
	bin   string
	dir   string
	args  []string
	names []string
	peers []string
	procs []*exec.Cmd
}

// FreePort returns a loopback TCP port free now; see FreePorts.
func FreePort(t testing.TB) int {
	t.Helper()
	return FreePorts(t, 1)[0]
}

// FreePorts returns n distinct loopback TCP ports, each free now
// (loopport.Free).
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports, err := loopport.Free(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}

// Start starts n members serving clients over scheme ("http", or "https"
// with etcd's TLS flags in args, which every member gets).
func Start(t testing.TB, n int, scheme string, args ...string) *Members {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Skip("no etcd binary (Debian: etcd-server)")
	}
	m := &Members{t: t, bin: bin, dir: t.TempDir(), args: args, procs: make([]*exec.Cmd, n)}
	ports := FreePorts(t, 2*n)
	for i := range n {
		m.names = append(m.names, "m"+strconv.Itoa(i))
		m.Clients = append(m.Clients, fmt.Sprintf("%s://127.0.0.1:%d", scheme, ports[2*i]))
		m.peers = append(m.peers, fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]))
	}
	for i := range n {
		m.Start(i)
	}
	t.Cleanup(func() {
		for i := range m.procs {
			m.Kill(i)
		}
	})
	return m
}

// Start (re)starts member i; a restarted member finds its data directory
// and rejoins with it.
func (m *Members) Start(i int) {
	m.t.Helper()
	var initial []string
	for j, name := range m.names {
		initial = append(initial, name+"="+m.peers[j])
	}
	cmd := exec.Command(m.bin, append([]string{"--name", m.names[i], "--data-dir", filepath.Join(m.dir, m.names[i]),
		"--listen-client-urls", m.Clients[i], "--advertise-client-urls", m.Clients[i],
		"--listen-peer-urls", m.peers[i], "--initial-advertise-peer-urls", m.peers[i],
		"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
		"--initial-cluster-token", "pd3-test", "--logger", "zap", "--log-level", "error"}, m.args...)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		m.t.Fatal(err)
	}
	m.procs[i] = cmd
}

// Kill SIGKILLs member i if it runs.
func (m *Members) Kill(i int) {
	if c := m.procs[i]; c != nil {
		c.Process.Signal(syscall.SIGKILL)
		c.Wait()
		m.procs[i] = nil
	}
}

// Leader returns the index of the running member that leads now, asking
// through cli; it fails the test if none does within 30 s.
func (m *Members) Leader(cli *clientv3.Client) int {
	m.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		for i, ep := range m.Clients {
			if m.procs[i] == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := cli.Status(ctx, ep)
			cancel()
			if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
				return i
			}
		}
	}
	m.t.Fatal("no etcd leader within 30s")
	return -1
}
