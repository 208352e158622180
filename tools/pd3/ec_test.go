package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/internal/nbdclient"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/tools/bench"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An erasure-coded volume (4+2) over eight memory-node processes: fio
// writes crc32c-verified blocks over NBD (a FLUSH every 16 writes) while
// two nodes are SIGKILLed: no client error, every
// block verifies afterwards (the dead nodes' pages decoded from the other
// shards), the shards that missed writes are dropped in the control
// plane. The host rebuilds the lost shards on the nodes left until pd3
// cluster status says healthy; then a third node dies and nothing is
// lost.
func TestErasureCodedVolumeSurvivesTwoNodeLosses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("fio is not installed (make deps-system)")
	}
	coord := start(t, []string{"etcd"}, "coord", "--listen", "127.0.0.1:0", "--dir", t.TempDir())
	etcd := coord.Addrs["etcd"]
	var nodes []*bench.Child
	for range 8 {
		nodes = append(nodes, start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0", "--etcd", etcd))
	}
	require.Eventually(t, func() bool {
		out, err := run(t, "", "cluster", "status", "--etcd", etcd, "--json")
		var st struct{ Nodes []cluster.Node }
		return err == nil && json.Unmarshal([]byte(out), &st) == nil && len(st.Nodes) == 8
	}, 20*time.Second, 100*time.Millisecond, "eight nodes registered")

	serve := []string{"serve", "--ec", "4+2", "--etcd", etcd, "--volume", "disk0:128MiB", "--volume-lease", "1s",
		"--cache", "2MiB", "--nbd", "127.0.0.1:0", "--page", "", "--op-timeout", "1s", "--writeback", "100ms"}
	host := start(t, []string{"NBD server"}, serve...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("host:\n%s", host.Output())
		}
	})
	assert.Regexp(t, `volume disk0 placed: erasure code 4\+2, 2 groups of 4\+2 extents of 16 MiB over [67] nodes`, host.Output())
	status := func() string {
		out, err := run(t, "", "cluster", "status", "--etcd", etcd)
		require.NoError(t, err, out)
		return out
	}
	first := status()
	assert.Regexp(t, `(?m)^disk0 +128MiB +\S+ +EC 4\+2 over [67] nodes +\S+ pid \d+$`, first)
	assert.Regexp(t, `disk0\s+128MiB\s+4\+2\s+2\s+0\s+0\s+1\s+healthy`, first)

	rounds := fioRounds{t: t, uri: "nbd://" + host.Addrs["NBD server"] + "/disk0", dir: t.TempDir(), region: 32 << 20, seed: 4600,
		args: []string{"--io_size=6m"}}
	rounds.under(0, "two memory nodes SIGKILLed", func() {
		require.NoError(t, syscall.Kill(nodes[1].Pid, syscall.SIGKILL))
		require.NoError(t, syscall.Kill(nodes[4].Pid, syscall.SIGKILL))
	})
	out, err := rounds.run(0, true)
	require.NoError(t, err, "verify: %s", out)
	require.NotContains(t, out, "verify: bad")
	// A round written entirely after the losses verifies too.
	rounds.under(1, "nothing more", func() {})
	out, err = rounds.run(1, true)
	require.NoError(t, err, "verify: %s", out)

	var rec struct{ EC *cluster.Coded }
	out, err = run(t, "", "volume", "ls", "--etcd", etcd, "--json")
	require.NoError(t, err, out)
	var recs []json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(out), &recs), out)
	require.Len(t, recs, 1)
	require.NoError(t, json.Unmarshal(recs[0], &rec))
	require.NotNil(t, rec.EC, out)
	assert.Greater(t, rec.EC.Epoch, uint64(1), "shards that missed writes were dropped: %s", out)
	_, lost := rec.EC.Health()
	assert.Zero(t, lost)
	// Rebuilt on the nodes left, each group's shards on distinct nodes.
	var last string
	healthy := regexp.MustCompile(`disk0\s+128MiB\s+4\+2\s+2\s+0\s+0\s+\d+\s+healthy`)
	require.Eventually(t, func() bool { last = status(); return healthy.MatchString(last) }, 60*time.Second, 500*time.Millisecond,
		"rebuilt: %s", last)
	assert.Contains(t, host.Output(), "ec: memory node down; its shards are dropped and decoded until rebuilt")
	assert.Regexp(t, `ec: volume disk0: shard \d of group \d rebuilt on node \w+ in \S+; 0 groups degraded`, host.Output())
	verify := func(when string) {
		for round := range 2 {
			out, err := rounds.run(round, true)
			require.NoError(t, err, "%s: round %d: verify: %s", when, round, out)
			require.NotContains(t, out, "verify: bad")
		}
	}
	verify("after the repair")

	// A third loss after the repair loses nothing.
	require.NoError(t, syscall.Kill(nodes[6].Pid, syscall.SIGKILL))
	verify("after a third loss")
	rounds.under(2, "writes after a third loss", func() {})
	out, err = rounds.run(2, true)
	require.NoError(t, err, "verify: %s", out)

	// The host SIGKILLed after a round whose writes fio flushed at its
	// end: the next one finds the volume left open, re-encodes its parity
	// before serving, and every block verifies. (A row torn by a crash
	// between its data and parity writes: TestResyncMendsATornRow.)
	last3 := rounds
	last3.args = append(slices.Clone(rounds.args), "--end_fsync=1")
	out, err = last3.run(3, false)
	require.NoError(t, err, out)
	require.NoError(t, syscall.Kill(host.Pid, syscall.SIGKILL))
	next := start(t, []string{"NBD server"}, serve...)
	assert.Contains(t, next.Output(), "ec: volume disk0 was left open by a host that stopped without closing it: parity re-encoded from the data")
	rounds.uri = "nbd://" + next.Addrs["NBD server"] + "/disk0"
	verify("on the next host")
	out, err = rounds.run(3, true)
	require.NoError(t, err, "verify: %s", out)
	next.Stop()
	third := start(t, []string{"NBD server"}, serve...)
	assert.NotContains(t, third.Output(), "was left open", "a host that stopped cleanly closed it")
}

// Three memory-node processes of one group SIGKILLed at once, more than
// 4+2 survives: a read of a page whose data shard died with the group's
// third loss answers EIO, every other page reads exactly what was
// written (the degraded group's lost pages decoded), the host keeps
// serving, and pd3 cluster status says which groups are lost.
func TestErasureCodedThreeLossesFailOnlyTheirPages(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	coord := start(t, []string{"etcd"}, "coord", "--listen", "127.0.0.1:0", "--dir", t.TempDir())
	etcd := coord.Addrs["etcd"]
	byAddr := map[string]*bench.Child{}
	for range 8 {
		n := start(t, []string{"memory node"}, "memnode", "--listen", "127.0.0.1:0", "--etcd", etcd)
		byAddr[n.Addrs["memory node"]] = n
	}
	var nodes []cluster.Node
	require.Eventually(t, func() bool {
		out, err := run(t, "", "cluster", "status", "--etcd", etcd, "--json")
		var st struct{ Nodes []cluster.Node }
		if err != nil || json.Unmarshal([]byte(out), &st) != nil {
			return false
		}
		nodes = st.Nodes
		return len(nodes) == 8
	}, 20*time.Second, 100*time.Millisecond, "eight nodes registered")
	host := start(t, []string{"NBD server"}, "serve", "--ec", "4+2", "--etcd", etcd, "--volume", "disk0:128MiB",
		"--cache", "2MiB", "--nbd", "127.0.0.1:0", "--page", "", "--op-timeout", "1s")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("host:\n%s", host.Output())
		}
	})

	// Every page its own contents, flushed to data and parity.
	const size, chunk = 128 << 20, 1 << 20
	want := func(off uint64, p []byte) {
		for i := 0; i < len(p); i += pageid.Size {
			r := rand.New(rand.NewPCG((off+uint64(i))/pageid.Size, 46))
			for j := i; j < i+pageid.Size; j += 8 {
				binary.LittleEndian.PutUint64(p[j:], r.Uint64())
			}
		}
	}
	c, err := nbdclient.Dial(host.Addrs["NBD server"], "disk0")
	require.NoError(t, err)
	defer c.Close()
	buf := make([]byte, chunk)
	for off := uint64(0); off < size; off += chunk {
		want(off, buf)
		require.NoError(t, c.Write(off, buf))
	}
	require.NoError(t, c.Flush())

	out, err := run(t, "", "volume", "ls", "--etcd", etcd, "--json")
	require.NoError(t, err, out)
	var recs []cluster.VolumeRecord
	require.NoError(t, json.Unmarshal([]byte(out), &recs), out)
	require.Len(t, recs, 1)
	p := recs[0].EC
	require.NotNil(t, p, out)
	require.Len(t, p.Groups, 2, out)

	// The first three shards of group 0 die together.
	killed := map[string]bool{}
	for _, id := range p.Groups[0][:3] {
		i := slices.IndexFunc(nodes, func(n cluster.Node) bool { return n.ID == id })
		require.GreaterOrEqual(t, i, 0, "node %s of the placement is registered", id)
		killed[id] = true
		require.NoError(t, syscall.Kill(byAddr[nodes[i].Addr].Pid, syscall.SIGKILL))
	}
	lostShards := func(g int) int {
		n := 0
		for s, id := range p.Groups[g] {
			if !p.Virtual(g, s) && killed[id] {
				n++
			}
		}
		return n
	}
	require.Greater(t, lostShards(0), p.M, "group 0 lost more than M shards")

	// Eight reads of 64 KiB in every extent.
	got, exp := make([]byte, 64<<10), make([]byte, 64<<10)
	var failed, read int
	for off := uint64(0); off < size; off += 2 << 20 {
		g, s, _ := p.Locate(off)
		gone := lostShards(g) > p.M && killed[p.Groups[g][s]]
		err := c.Read(off, got)
		if gone {
			require.Error(t, err, "offset %d: group %d shard %d is lost with more than M of its group", off, g, s)
			require.ErrorContains(t, err, "EIO")
			failed++
			continue
		}
		require.NoError(t, err, "offset %d: group %d shard %d", off, g, s)
		want(off, exp)
		require.True(t, bytes.Equal(exp, got), "offset %d: group %d shard %d read back what was written", off, g, s)
		read++
	}
	t.Logf("after three losses: %d reads failed with EIO, %d read back", failed, read)
	assert.Equal(t, 3*8, failed, "the three data extents whose shards died")
	assert.Equal(t, 5*8, read)

	st, err := run(t, "", "cluster", "status", "--etcd", etcd)
	require.NoError(t, err, st)
	assert.Regexp(t, `disk0\s+128MiB\s+4\+2\s+2\s+2\s+1\s+\d+\s+lost`, st)
}
