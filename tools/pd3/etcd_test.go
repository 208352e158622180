package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/internal/nbdclient"
	"github.com/pd3-go/pd3/internal/testetcd"
	"github.com/pd3-go/pd3/tools/bench"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestEtcdMemberAndLeaderLoss: a host and a memory node on a three-member
// etcd (separate processes). fio writes crc32c-verified blocks over NBD
// (a FLUSH every 16 writes) while a follower is SIGKILLed (and restarted),
// then while the leader is: no client error, the host's session lives on
// (it is never fenced), and every block verifies afterwards. Then the
// whole control plane dies: I/O goes on for the already-open volume
// within the session's TTL and stops with errors once it has run out, not
// risking a second writer.
func TestEtcdMemberAndLeaderLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("fio is not installed (make deps-system)")
	}
	members := testetcd.Start(t, 3, "http")
	etcd := strings.Join(members.Clients, ",")
	var cli *clientv3.Client
	require.Eventually(t, func() bool {
		var err error
		cli, err = cluster.Dial(context.Background(), cluster.Access{Endpoints: members.Clients})
		return err == nil
	}, 30*time.Second, 200*time.Millisecond, "the etcd cluster forms")
	defer cli.Close()

	node := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0", "--etcd", etcd)
	const ttl = 3 * time.Second
	host := start(t, []string{"NBD server", "page server"}, "serve", "--memnode", node.Addrs["memory node"], "--etcd", etcd,
		"--volume-lease", ttl.String(), "--volume", "disk0:64MiB", "--cache", "2MiB", "--nbd", "127.0.0.1:0",
		"--page", "127.0.0.1:0", "--mount", "", "--writeback", "100ms")
	// About four seconds a round (2048 writes at 500 a second): long
	// enough for a kill and an election to happen under it.
	rounds := fioRounds{t: t, uri: "nbd://" + host.Addrs["NBD server"] + "/disk0", dir: t.TempDir(), region: 8 << 20, seed: 2000}
	fio, underFio := rounds.run, rounds.under

	lead := members.Leader(cli)
	follower := (lead + 1) % 3
	underFio(0, "SIGKILL of a follower", func() { members.Kill(follower) })
	members.Start(follower)
	underFio(1, "SIGKILL of the leader", func() { members.Kill(lead) })
	newLead := members.Leader(cli)
	assert.NotEqual(t, lead, newLead)
	members.Start(lead)
	underFio(2, "a member back", func() {})
	time.Sleep(2 * ttl) // renewals through the new leader, past a whole TTL
	assert.NotContains(t, host.Output(), "lost this host's session", "lease renewals continued through both kills")
	for round := range 3 {
		out, err := fio(round, true)
		require.NoError(t, err, "round %d: %s", round, out)
		require.NotContains(t, out, "verify: bad", "round %d", round)
	}

	// The whole control plane gone: within the TTL the open volume is
	// served; past it, the host gives the volume up and answers errors.
	page := host.Addrs["page server"]
	out, err := run(t, "written while etcd is down", "page", "put", "--page", page, "1:5")
	require.NoError(t, err, out)
	for i := range members.Clients {
		members.Kill(i)
	}
	lost := time.Now()
	out, err = run(t, "", "page", "get", "--page", page, "1:5")
	require.NoError(t, err, "I/O goes on within the lease: %s", out)
	assert.True(t, strings.HasPrefix(out, "written while etcd is down\x00"))
	require.NoError(t, host.WaitOutput("lost this host's session", 3*ttl))
	// A TTL without renewals, then up to half a TTL asking etcd whether
	// the lease is still there (cluster.Host), with the client's 0.5 s
	// deadline checks; a second of slack for a loaded machine.
	assert.Less(t, time.Since(lost), ttl+ttl/2+2*time.Second, "the host stops serving about 1.5 TTL after etcd went silent")
	out, err = run(t, "", "page", "get", "--page", page, "1:5")
	require.Error(t, err, "a host without its session must not serve the volume: %s", out)
	assert.Contains(t, out, "I/O error", "EIO, as NBD would answer")
	assert.Contains(t, host.Output(), "taken over by another host", "the host's log says why")
	// A host whose session is gone stops without complaint about it.
	p, _ := os.FindProcess(host.Pid)
	require.NoError(t, p.Signal(syscall.SIGTERM))
	require.NoError(t, host.WaitOutput("stopped", 10*time.Second))
	assert.NotContains(t, host.Output(), "ending the host's session")
}

// pd3 volume against real processes: placement by room, records that
// refuse duplicates and the removal of a held volume, hosts recording the
// volumes they create, and rm freeing the node's memory.
func TestVolumeCommands(t *testing.T) {
	coord := start(t, []string{"etcd"}, "coord", "--listen", "127.0.0.1:0", "--dir", t.TempDir())
	etcd := coord.Addrs["etcd"]
	roomy := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0", "--etcd", etcd)
	start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0", "--etcd", etcd, "--capacity", "8MiB")
	vol := func(args ...string) (string, error) {
		return run(t, "", append(append([]string{"volume"}, args...), "--etcd", etcd)...)
	}
	for range 3 { // the small node never fits 16 MiB, whichever two are drawn
		out, err := vol("create", "big", "--size", "16MiB")
		require.NoError(t, err, out)
		assert.Contains(t, out, "volume big: 16MiB on node")
		assert.Contains(t, out, roomy.Addrs["memory node"])
		out, err = vol("create", "big", "--size", "1MiB")
		require.Error(t, err)
		assert.Contains(t, out, `cluster: volume exists: "big"`)
		out, err = vol("rm", "big")
		require.NoError(t, err, out)
	}
	out, err := vol("create", "huge", "--size", "1TiB", "--cluster", "empty")
	require.Error(t, err)
	assert.Contains(t, out, "no memory node up with room")
	out, err = vol("ls", "--etcd-ca", "/nonexistent/ca.pem")
	require.Error(t, err)
	assert.Contains(t, out, "--etcd-ca/--etcd-cert/--etcd-key: TLS CA: open /nonexistent/ca.pem")
	out, err = vol("create", "x", "--size", "lots")
	require.Error(t, err)
	assert.Contains(t, out, `--size "lots"`)

	out, err = vol("create", "big", "--size", "16MiB")
	require.NoError(t, err, out)
	host := start(t, []string{"page server"}, "serve", "--memnode", roomy.Addrs["memory node"], "--etcd", etcd,
		"--page", "127.0.0.1:0", "--nbd", "", "--mount", "", "--volume", "big:16MiB", "--volume", "made-by-host:1MiB")
	out, err = vol("ls")
	require.NoError(t, err, out)
	assert.Regexp(t, `big\s+16MiB\s+\w+\s+ready\s+\S+ pid `+strconv.Itoa(host.Pid), out)
	assert.Regexp(t, `made-by-host\s+1MiB\s+\w+\s+ready\s+\S+ pid `+strconv.Itoa(host.Pid), out, "a host records the volumes it creates")
	out, err = vol("rm", "big")
	require.Error(t, err)
	assert.Contains(t, out, `cluster: volume "big": held by another host`)
	assert.Contains(t, out, "stop the host serving it (pd3 cluster status shows which), then run pd3 volume rm again")
	out, err = vol("resize", "big", "--size", "32MiB")
	require.Error(t, err)
	assert.Contains(t, out, `cluster: volume "big": held by another host`)
	recs := func() map[string]cluster.VolumeRecord {
		out, err := vol("ls", "--json")
		require.NoError(t, err, out)
		var rows []cluster.VolumeRecord
		require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
		m := map[string]cluster.VolumeRecord{}
		for _, r := range rows {
			m[r.Name] = r
		}
		return m
	}
	big := strconv.Itoa(int(recs()["big"].ID))
	_, err = run(t, "before the resize", "page", "put", "--page", host.Addrs["page server"], big+":3")
	require.NoError(t, err)

	host.Stop()
	out, err = vol("resize", "big", "--size", "32MiB")
	require.NoError(t, err, out)
	assert.Contains(t, out, "volume big: 16MiB -> 32MiB")
	assert.Equal(t, uint64(32<<20), recs()["big"].Size)
	out, err = vol("resize", "big", "--size", "8MiB")
	require.Error(t, err)
	assert.Contains(t, out, "volume big is 32MiB: it cannot shrink to 8MiB")
	// A host started with the old size serves the volume's.
	host = start(t, []string{"page server", "NBD server"}, "serve", "--memnode", roomy.Addrs["memory node"], "--etcd", etcd,
		"--page", "127.0.0.1:0", "--nbd", "127.0.0.1:0", "--mount", "", "--volume", "big:16MiB")
	nc, err := nbdclient.Dial(host.Addrs["NBD server"], "big")
	require.NoError(t, err)
	assert.Equal(t, uint64(32<<20), nc.Size)
	got := make([]byte, 4096)
	require.NoError(t, nc.Read(3*4096, got))
	assert.True(t, strings.HasPrefix(string(got), "before the resize\x00"))
	require.NoError(t, nc.Read(32<<20-4096, got))
	assert.Equal(t, make([]byte, 4096), got, "the new bytes")
	nc.Close()
	host.Stop()

	out, err = vol("rm", "big")
	require.NoError(t, err, out)
	assert.Contains(t, out, "volume big removed: 32MiB freed at 1 memory node")
	out, err = vol("ls", "--json")
	require.NoError(t, err, out)
	var rows []cluster.VolumeRecord
	require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
	require.Len(t, rows, 1)
	assert.Equal(t, "made-by-host", rows[0].Name)
	out, err = run(t, "", "cluster", "status", "--etcd", etcd)
	require.NoError(t, err, out)
	assert.NotContains(t, out, "big", "rm freed the volume at its node")
	out, err = vol("rm", "big")
	require.Error(t, err)
	assert.Contains(t, out, `cluster: no such volume: "big"`)
}

// pd3 coord as a three-member control plane, real processes: the members
// form the cluster together, a memory node registers through all of them,
// and losing one (SIGKILL) leaves the cluster's view working; the member
// comes back from its data directory.
func TestCoordThreeMembers(t *testing.T) {
	dir := t.TempDir()
	var initial []string
	peers, clients := make([]string, 3), make([]string, 3)
	ports := testetcd.FreePorts(t, 6)
	for i := range 3 {
		peers[i] = fmt.Sprintf("127.0.0.1:%d", ports[2*i])
		clients[i] = fmt.Sprintf("127.0.0.1:%d", ports[2*i+1])
		initial = append(initial, fmt.Sprintf("c%d=http://%s", i, peers[i]))
	}
	args := func(i int) []string {
		return []string{"coord", "--name", "c" + strconv.Itoa(i), "--listen", clients[i], "--initial-cluster", strings.Join(initial, ","),
			"--dir", filepath.Join(dir, strconv.Itoa(i))}
	}
	members := make([]*bench.Child, 3)
	errs := make(chan error, 3)
	for i := range 3 { // each waits for a majority: start them together
		go func() {
			c, err := bench.StartChild(context.Background(), pd3Bin, []string{"etcd"}, args(i)...)
			members[i] = c
			errs <- err
		}()
	}
	for range 3 {
		require.NoError(t, <-errs)
	}
	for _, m := range members {
		t.Cleanup(m.Stop)
	}
	etcd := "http://" + strings.Join(clients, ",http://")
	node := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0", "--etcd", etcd)
	status := func() string {
		out, err := run(t, "", "cluster", "status", "--etcd", etcd)
		require.NoError(t, err, out)
		return out
	}
	assert.Contains(t, status(), node.Addrs["memory node"])

	require.NoError(t, syscall.Kill(members[1].Pid, syscall.SIGKILL))
	members[1].Stop()
	time.Sleep(6 * time.Second) // past the node's 5 s lease: renewed through the others
	assert.Regexp(t, `\s+up\s+`+regexp.QuoteMeta(node.Addrs["memory node"]), status())
	members[1] = start(t, []string{"etcd"}, args(1)...)
	out, err := run(t, "", "cluster", "status", "--etcd", "http://"+clients[1])
	require.NoError(t, err, "the member is back with the cluster's data: %s", out)
	assert.Contains(t, out, node.Addrs["memory node"])

	out, err = run(t, "", "coord", "--name", "x", "--initial-cluster", initial[0], "--dir", t.TempDir())
	require.Error(t, err)
	assert.Contains(t, out, "--initial-cluster does not list this member (--name x)")
}

// The partition of ARCHITECTURE's Departures with real processes and a
// real link: the old host runs in its own network namespace, the control
// plane and the memory node outside it. With a page's write-back on its
// way, the link goes down (packets vanish, no reset) past the host's
// lease; a second host takes the volume, writes the page and syncs. When
// the link comes back, TCP delivers the old write-back and the node
// refuses it: a third host reads the new owner's data. (With the token
// not presented, the old bytes win: checked by hand, as for the
// in-process test.)
func TestPartitionedHostIsFencedOverARealLink(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	vn := newVethNS(t)
	coord := start(t, []string{"etcd"}, "coord", "--listen", vn.rootIP+":0", "--dir", t.TempDir())
	etcd := coord.Addrs["etcd"]
	node := start(t, []string{"memory node"}, "memnode", "--listen", vn.rootIP+":0", "--etcd", etcd)
	serve := []string{"serve", "--memnode", node.Addrs["memory node"], "--etcd", etcd, "--volume", "disk0:1MiB",
		"--volume-lease", "2s", "--writeback", "0", "--op-timeout", "60s", "--dpu", "none", "--nbd", "", "--mount", ""}
	old, err := bench.StartChild(context.Background(), "ip", []string{"page server"},
		append([]string{"netns", "exec", vn.ns, pd3Bin}, append(serve, "--page", vn.nsIP+":7000")...)...)
	require.NoError(t, err)
	t.Cleanup(old.Stop)
	inNS := func(stdin string, args ...string) (string, error) {
		cmd := exec.Command("ip", append([]string{"netns", "exec", vn.ns, pd3Bin}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := inNS("the old host's late write", "page", "put", "--page", vn.nsIP+":7000", "1:0")
	require.NoError(t, err, out)

	heal := vn.Cut()
	synced := make(chan string, 1)
	go func() { // its WRITE leaves into the dead link and is retransmitted later
		out, err := inNS("", "page", "sync", "--page", vn.nsIP+":7000")
		synced <- fmt.Sprint(err, ": ", out)
	}()
	next := start(t, []string{"page server"}, append(serve, "--page", "127.0.0.1:0")...) // waits out the old hold
	out, err = run(t, "the new owner's data", "page", "put", "--page", next.Addrs["page server"], "1:0")
	require.NoError(t, err, out)
	out, err = run(t, "", "page", "sync", "--page", next.Addrs["page server"])
	require.NoError(t, err, out)

	heal()
	select {
	case res := <-synced:
		assert.NotContains(t, res, "<nil>", "the old host's sync must fail: %s", res)
	case <-time.After(90 * time.Second):
		t.Fatal("the old host's sync never returned")
	}
	assert.Contains(t, old.Output(), "fenced: the volume was taken over", "refused by the node, and the old host says so")
	next.Stop() // everything written back, the volume let go
	third := start(t, []string{"page server"}, append(serve, "--page", "127.0.0.1:0")...)
	out, err = run(t, "", "page", "get", "--page", third.Addrs["page server"], "1:0")
	require.NoError(t, err, out)
	assert.True(t, strings.HasPrefix(out, "the new owner's data\x00"), "%.40q", out)
}

// Replicated volumes over real processes: three memory nodes, each in its
// own network namespace, a host with --replicas 2 in the root one. fio
// writes crc32c-verified blocks over NBD (a FLUSH every 16 writes) and,
// at the same time, to a file of the host's FUSE mount (an fsync every
// 16) while one node is cut off (link down, no reset) past the op
// timeout and healed, then while another is SIGKILLed: no client error,
// every block verifies afterwards. The cut-off node is dropped from the extents
// written meanwhile (it missed writes: never read again); the dead one
// from every extent once its lease is gone. The host copies the degraded
// extents to the nodes left until pd3 cluster status says healthy; then
// a second node dies and nothing is lost. The first two nodes are chosen
// so that no extent of the first round is on both: that extent would be
// lost before any repair (TestLostExtentFailsItsPagesOnly covers it); the
// filesystem's volumes live on two nodes, which may be those two, so
// the kill waits for the cut's repair.
func TestReplicatedVolumeSurvivesANodeLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("fio is not installed (make deps-system)")
	}
	port := strconv.Itoa(testetcd.FreePort(t))
	start(t, []string{"etcd"}, "coord", "--listen", "0.0.0.0:"+port, "--dir", t.TempDir())
	etcd := "http://127.0.0.1:" + port
	byAddr := map[string]int{}
	var nodes []*bench.Child
	var links []*vethNS
	for i := range 3 {
		vn := newVethNS(t)
		c, err := bench.StartChild(context.Background(), "ip", []string{"memory node"}, "netns", "exec", vn.ns, pd3Bin, "memnode",
			"--listen", vn.nsIP+":7100", "--etcd", "http://"+vn.rootIP+":"+port)
		require.NoError(t, err)
		t.Cleanup(c.Stop)
		nodes, links = append(nodes, c), append(links, vn)
		byAddr[vn.nsIP+":7100"] = i
	}
	type statusJSON struct {
		Nodes []cluster.Node `json:"nodes"`
	}
	index := map[string]int{} // node id → which of the three
	require.Eventually(t, func() bool {
		out, err := run(t, "", "cluster", "status", "--etcd", etcd, "--json")
		var st statusJSON
		if err != nil || json.Unmarshal([]byte(out), &st) != nil || len(st.Nodes) != 3 {
			return false
		}
		for _, n := range st.Nodes {
			index[n.ID] = byAddr[n.Addr]
		}
		return true
	}, 20*time.Second, 200*time.Millisecond, "three nodes registered")
	mnt := t.TempDir()
	t.Cleanup(func() { exec.Command("fusermount3", "-uz", mnt).Run() }) // after the host stops, if it did not unmount
	host := start(t, []string{"NBD server"}, "serve", "--replicas", "2", "--etcd", etcd, "--volume", "disk0:64MiB",
		"--cache", "2MiB", "--nbd", "127.0.0.1:0", "--page", "", "--op-timeout", "1s", "--writeback", "100ms", "--mount", mnt)
	assert.Contains(t, host.Output(), "volume disk0 placed: 4 extents of 16 MiB over 3 nodes, 2 replicas each")
	assert.Regexp(t, `filesystem pd3 placed over nodes \w+, \w+`, host.Output())
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("host:\n%s", host.Output())
		}
	})
	file := filepath.Join(mnt, "fio.dat")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	require.NoError(t, os.Truncate(file, 64<<20))
	stripes := func() cluster.Stripes { return stripesOf(t, etcd) }
	// The pair of nodes no extent of the first 32 MiB is on: cut one,
	// kill the other.
	before := stripes()
	pairs := map[[2]int]bool{}
	for _, e := range before.Extents[:2] {
		a, b := index[e[0]], index[e[1]]
		pairs[[2]int{min(a, b), max(a, b)}] = true
	}
	holds := map[int]bool{} // nodes holding an extent of the first 32 MiB
	for _, e := range before.Extents[:2] {
		holds[index[e[0]]], holds[index[e[1]]] = true, true
	}
	cut, kill := -1, -1
	for _, p := range [][2]int{{0, 1}, {0, 2}, {1, 2}} {
		switch {
		case pairs[p]:
		case holds[p[0]]:
			cut, kill = p[0], p[1]
		case holds[p[1]]:
			cut, kill = p[1], p[0]
		}
	}
	require.NotEqual(t, -1, cut)

	rounds := fioRounds{t: t, uri: "nbd://" + host.Addrs["NBD server"] + "/disk0", dir: t.TempDir(), region: 32 << 20, seed: 3000,
		args: []string{"--io_size=6m"}}
	onFile := rounds
	onFile.uri, onFile.file, onFile.dir, onFile.seed = "", file, t.TempDir(), 3100
	both := []fioRounds{rounds, onFile}
	fio := func(round int, verify bool) (string, error) {
		var outs []string
		for _, r := range both {
			out, err := r.run(round, verify)
			if err != nil {
				return out, err
			}
			outs = append(outs, out)
		}
		return strings.Join(outs, "\n"), nil
	}
	underFio := func(round int, what string, act func()) { underAll(t, both, round, what, act) }
	status := func() string {
		out, err := run(t, "", "cluster", "status", "--etcd", etcd)
		require.NoError(t, err, out)
		return out
	}
	first := status()
	assert.Regexp(t, `disk0\s+64MiB\s+4\s+2\s+0\s+0\s+1\s+healthy`, first)
	// One row per volume, however many nodes hold a copy.
	assert.Contains(t, first, "\n1 volume\n")
	assert.Regexp(t, `(?m)^disk0 +64MiB +\S+ +R=2 over 3 nodes +\S+ pid \d+$`, first)
	assert.Regexp(t, `and \d+ filesystem volumes? \(the files and metadata of pd3 mounts\)`, first)
	healthy := regexp.MustCompile(`disk0\s+64MiB\s+4\s+2\s+0\s+0\s+\d+\s+healthy\s+fs\.pd3\s+4TiB\s+1\s+2\s+0\s+0\s+\d+\s+healthy`)

	underFio(0, "a node cut off and healed", func() {
		heal := links[cut].Cut()
		// Past the op timeout, well within the node's 5 s etcd lease
		// (TCP's retransmission backoff delays its next renewal).
		time.Sleep(2 * time.Second)
		heal()
	})
	after := stripes()
	assert.Greater(t, after.Epoch, before.Epoch, "the cut-off node was dropped where it missed writes")
	for e := range 2 {
		for _, id := range after.Extents[e] {
			assert.NotEqual(t, cut, index[id], "extent %d still lists the node that missed writes", e)
		}
	}
	// The filesystem's two nodes may be the cut one and the one to kill:
	// its copy to the third node must be done first.
	var last string
	require.Eventually(t, func() bool { last = status(); return healthy.MatchString(last) }, 30*time.Second, 500*time.Millisecond,
		"repaired after the cut: %s", last)
	underFio(1, "SIGKILL of a memory node", func() { require.NoError(t, syscall.Kill(nodes[kill].Pid, syscall.SIGKILL)) })
	require.NoError(t, host.WaitOutput("memory node down; its replicas are dropped", 15*time.Second))
	verify := func(when string) {
		for round := range 2 {
			out, err := fio(round, true)
			require.NoError(t, err, "%s: round %d: verify: %s", when, round, out)
			require.NotContains(t, out, "verify: bad")
		}
	}
	verify("after the kill")
	// The two nodes left hold every extent twice again: re-replicated
	// from the survivors, the cut-off node included (cleared first).
	require.Eventually(t, func() bool { last = status(); return healthy.MatchString(last) }, 30*time.Second, 500*time.Millisecond,
		"repaired: %s", last)
	assert.Contains(t, host.Output(), "; 0 extents degraded")
	verify("after the repair")

	// A second failure after the repair loses nothing: every extent is
	// on the last node.
	survivor := 3 - cut - kill
	require.NoError(t, syscall.Kill(nodes[cut].Pid, syscall.SIGKILL))
	require.Eventually(t, func() bool {
		return strings.Count(host.Output(), "memory node down; its replicas are dropped") == 2
	}, 15*time.Second, 200*time.Millisecond)
	verify("after a second failure")
	after = stripes()
	for e, reps := range after.Extents {
		require.Len(t, reps, 1, "extent %d", e)
		assert.Equal(t, survivor, index[reps[0]], "extent %d", e)
	}
	last = status()
	assert.Regexp(t, `disk0\s+64MiB\s+4\s+2\s+4\s+0\s+\d+\s+degraded`, last, "no node left to copy to")
	assert.Contains(t, last, "disk0: [..............................] 0/4 extents with 2 replicas, 0 being copied")
}

// fioRounds are rounds of fio writing crc32c-verified random 4 KiB blocks
// over NBD at 500 a second with a FLUSH every 16, each round in its own
// region of the volume, with the state kept for a later verify.
type fioRounds struct {
	t        *testing.T
	uri, dir string
	file     string // if set, fio writes this file (O_DIRECT), not uri
	region   int
	seed     int
	args     []string
}

// run writes round's blocks, or with verify checks them.
func (f fioRounds) run(round int, verify bool) (string, error) {
	target := []string{"--ioengine=nbd", "--uri=" + f.uri}
	if f.file != "" {
		target = []string{"--ioengine=psync", "--direct=1", "--filename=" + f.file}
	}
	args := append([]string{"--name=r" + strconv.Itoa(round), "--rw=randwrite", "--bs=4k",
		"--offset=" + strconv.Itoa(round*f.region), "--size=" + strconv.Itoa(f.region), "--iodepth=8", "--fsync=16",
		"--verify=crc32c", "--verify_fatal=1", "--randseed=" + strconv.Itoa(f.seed+round)}, append(target, f.args...)...)
	if verify {
		args = append(args, "--verify_only", "--verify_state_load=1")
	} else {
		args = append(args, "--rate_iops=500", "--do_verify=0", "--verify_state_save=1")
	}
	return fioIn(f.dir, args...)
}

// under runs act a second into a round of writes, which must see no error.
func (f fioRounds) under(round int, what string, act func()) {
	underAll(f.t, []fioRounds{f}, round, what, act)
}

// underAll runs act a second into a round of writes of each of rs at
// once, which must see no error.
func underAll(t *testing.T, rs []fioRounds, round int, what string, act func()) {
	errs := make([]error, len(rs))
	outs := make([]string, len(rs))
	var wg sync.WaitGroup
	for i, f := range rs {
		wg.Go(func() { outs[i], errs[i] = f.run(round, false) })
	}
	time.Sleep(time.Second) // fio is another process: the act falls a second into its run
	act()
	wg.Wait()
	for i := range rs {
		require.NoError(t, errs[i], "%s under fio: %s", what, outs[i])
	}
}

// pd3 node drain and pd3 cluster rebalance under fio, real processes: a
// node is drained while fio writes verified blocks over NBD (no client
// error, the node holds nothing afterwards and no map lists it); then a
// new node joins and a rebalance under fio gives it its share. Every
// block verifies at the end.
func TestDrainAndRebalanceUnderFio(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("fio is not installed (make deps-system)")
	}
	coord := start(t, []string{"etcd"}, "coord", "--listen", "127.0.0.1:0", "--dir", t.TempDir())
	etcd := coord.Addrs["etcd"]
	newNode := func() *bench.Child {
		return start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0", "--etcd", etcd)
	}
	var nodes []*bench.Child
	for range 3 {
		nodes = append(nodes, newNode())
	}
	out, err := run(t, "", "volume", "create", "disk0", "--size", "96MiB", "--replicas", "2", "--etcd", etcd)
	require.NoError(t, err, out)
	assert.Contains(t, out, "volume disk0: 96MiB in 6 extents over 3 nodes, 2 replicas each")
	host := start(t, []string{"NBD server"}, "serve", "--replicas", "2", "--etcd", etcd, "--volume", "disk0:96MiB",
		"--cache", "2MiB", "--nbd", "127.0.0.1:0", "--page", "", "--writeback", "100ms")
	rounds := fioRounds{t: t, uri: "nbd://" + host.Addrs["NBD server"] + "/disk0", dir: t.TempDir(), region: 32 << 20, seed: 4000,
		args: []string{"--io_size=6m"}}
	type statusJSON struct {
		Nodes []cluster.Node `json:"nodes"`
	}
	nodeInfo := func(addr string) cluster.Node {
		out, err := run(t, "", "cluster", "status", "--etcd", etcd, "--json")
		require.NoError(t, err, out)
		var st statusJSON
		require.NoError(t, json.Unmarshal([]byte(out), &st), out)
		for _, n := range st.Nodes {
			if n.Addr == addr {
				return n
			}
		}
		t.Fatalf("no node at %s: %s", addr, out)
		return cluster.Node{}
	}
	stripes := func() cluster.Stripes { return stripesOf(t, etcd) }
	rounds.run(0, false) // data on every node first
	drained := nodeInfo(nodes[0].Addrs["memory node"])
	rounds.under(1, "pd3 node drain", func() {
		out, err := run(t, "", "node", "drain", drained.ID, "--etcd", etcd)
		require.NoError(t, err, out)
		assert.Regexp(t, `node \w+ draining: \d+ extents to move`, out)
	})
	after := stripes()
	for e := range after.Extents {
		assert.NotContains(t, after.Writers(e), drained.ID, "extent %d", e)
	}
	require.Eventually(t, func() bool { n := nodeInfo(drained.Addr); return n.Stored == 0 && n.Draining }, 10*time.Second, 200*time.Millisecond,
		"the drained node holds nothing")
	for round := range 2 {
		out, err := rounds.run(round, true)
		require.NoError(t, err, "after the drain: round %d: %s", round, out)
	}

	fresh := newNode()
	rounds.under(2, "pd3 cluster rebalance", func() {
		out, err := run(t, "", "cluster", "rebalance", "--etcd", etcd)
		require.NoError(t, err, out)
		assert.Contains(t, out, "4 extents to move", "12 replicas over 3 nodes: the new one takes 4")
	})
	id := nodeInfo(fresh.Addrs["memory node"]).ID
	held := 0
	for _, reps := range stripes().Extents {
		if slices.Contains(reps, id) {
			held++
		}
	}
	assert.Equal(t, 4, held, "the new node's share")
	for round := range 3 {
		out, err := rounds.run(round, true)
		require.NoError(t, err, "after the rebalance: round %d: %s", round, out)
	}

	// Grown while no host serves it: new extents placed, two replicas
	// each; the old blocks still verify and the new range takes writes.
	host.Stop()
	out, err = run(t, "", "volume", "resize", "disk0", "--size", "136MiB", "--etcd", etcd)
	require.NoError(t, err, out)
	assert.Contains(t, out, "volume disk0: 96MiB -> 136MiB, 6 extents -> 9")
	grown := stripes()
	require.Len(t, grown.Extents, 9)
	for e, reps := range grown.Extents {
		assert.Len(t, reps, 2, "extent %d", e)
	}
	host = start(t, []string{"NBD server"}, "serve", "--replicas", "2", "--etcd", etcd, "--volume", "disk0:96MiB",
		"--cache", "2MiB", "--nbd", "127.0.0.1:0", "--page", "", "--writeback", "100ms")
	rounds.uri = "nbd://" + host.Addrs["NBD server"] + "/disk0"
	out, err = rounds.run(3, false) // 96–128 MiB: the new extents
	require.NoError(t, err, out)
	for round := range 4 {
		out, err := rounds.run(round, true)
		require.NoError(t, err, "after the resize: round %d: %s", round, out)
	}
	out, err = run(t, "", "volume", "resize", "disk0", "--size", "64MiB", "--etcd", etcd)
	require.Error(t, err)
	assert.Contains(t, out, "volume disk0 is 136MiB: it cannot shrink to 64MiB")

	out, err = run(t, "", "node", "undrain", drained.ID, "--etcd", etcd)
	require.NoError(t, err, out)
	assert.Contains(t, out, "node "+drained.ID+" takes volumes and extents again")
	assert.False(t, nodeInfo(drained.Addr).Draining)
}

// stripesOf is the stripe map of the one replicated volume of the
// cluster at etcd, as pd3 volume ls --json shows it.
func stripesOf(t *testing.T, etcd string) cluster.Stripes {
	t.Helper()
	out, err := run(t, "", "volume", "ls", "--json", "--etcd", etcd)
	require.NoError(t, err, out)
	var rows []cluster.VolumeRecord
	require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
	i := slices.IndexFunc(rows, func(r cluster.VolumeRecord) bool { return r.Name == "disk0" })
	require.NotEqual(t, -1, i, out)
	require.NotNil(t, rows[i].Stripes)
	return *rows[i].Stripes
}

// TestServeWithoutAMemoryNode: pd3 serve given the control plane and no
// --memnode places its volume over the three registered nodes, keeps what
// a client wrote across a restart, and, for a volume pd3 volume create put
// on one node, names the node to serve it from.
func TestServeWithoutAMemoryNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	port := strconv.Itoa(testetcd.FreePort(t))
	start(t, []string{"etcd"}, "coord", "--listen", "127.0.0.1:"+port, "--dir", t.TempDir())
	etcd := "http://127.0.0.1:" + port
	for range 3 {
		start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0", "--etcd", etcd)
	}
	serve := func() *bench.Child {
		return start(t, []string{"NBD server"}, "serve", "--etcd", etcd, "--volume", "disk0:64MiB", "--nbd", "127.0.0.1:0", "--page", "")
	}
	host := serve()
	assert.Contains(t, host.Output(), "no --memnode: the control plane places the volumes")
	assert.Regexp(t, `volume disk0 placed: 4 extents of 16 MiB over [1-3] nodes?, 1 replica each`, host.Output())
	nc, err := nbdclient.Dial(host.Addrs["NBD server"], "disk0")
	require.NoError(t, err)
	block := make([]byte, 64<<10)
	for i := range 16 { // one block in each MiB of the first 16
		block[0], block[len(block)-1] = byte(i), 0x5a
		require.NoError(t, nc.Write(uint64(i)<<20, block))
	}
	require.NoError(t, nc.Flush())
	nc.Close()
	host.Stop()

	host = serve()
	assert.NotContains(t, host.Output(), "placed:", "found again, not placed anew")
	nc, err = nbdclient.Dial(host.Addrs["NBD server"], "disk0")
	require.NoError(t, err)
	defer nc.Close()
	for i := range 16 {
		require.NoError(t, nc.Read(uint64(i)<<20, block))
		assert.Equal(t, []byte{byte(i), 0x5a}, []byte{block[0], block[len(block)-1]}, "MiB %d", i)
	}
	host.Stop()

	out, err := run(t, "", "volume", "create", "one", "--size", "16MiB", "--etcd", etcd)
	require.NoError(t, err, out)
	out, err = run(t, "", "serve", "--etcd", etcd, "--volume", "one:16MiB", "--nbd", "127.0.0.1:0", "--page", "")
	require.Error(t, err)
	assert.Regexp(t, `--memnode: volume "one" lives on memory node 127\.0\.0\.1:\d+ alone, not striped: set --memnode to 127\.0\.0\.1:\d+`, out)
}
