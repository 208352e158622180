package memcg

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A command started in a group runs in it, its memory is charged there,
// and the group goes once its process has.
func TestCommandRunsInTheGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("memory cgroups need root")
	}
	g, err := New("pd3-memcg-test-"+strings.ReplaceAll(t.Name(), "/", "-"), 64<<20)
	if err == ErrUnsupported {
		t.Skip(err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { g.Close() })
	assert.Equal(t, uint64(64<<20), g.Limit())

	// The shell reads its own cgroup and fills 8 MiB of page cache.
	tmp := t.TempDir()
	out, err := g.Command("/bin/sh", "-c", "cat /proc/self/cgroup; head -c 8388608 /dev/zero > "+tmp+"/f; cat "+tmp+"/f > /dev/null").CombinedOutput()
	require.NoError(t, err, string(out))
	name := g.Dir()[strings.LastIndex(g.Dir(), "/")+1:]
	assert.Contains(t, string(out), "/"+name+"\n", "the command ran in the group")
	assert.GreaterOrEqual(t, g.Peak(), uint64(8<<20), "its page cache was charged to the group (v%d)", g.Version())
	assert.Empty(t, g.Procs(), "nothing left running")
	require.NoError(t, g.Close())
	_, err = os.Stat(g.Dir())
	assert.True(t, os.IsNotExist(err), "the group is gone")
}

func TestBadArguments(t *testing.T) {
	_, err := New("a/b", 1<<20)
	assert.ErrorContains(t, err, "bad group name")
	_, err = New("x", 0)
	assert.ErrorContains(t, err, "limit of 0")
}
