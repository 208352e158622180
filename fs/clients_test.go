package fs_test

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func need(t *testing.T, bin string) {
	t.Helper()
	if _, err := exec.LookPath(bin); err != nil {
		t.Skipf("%s not installed (make deps-system)", bin)
	}
}

// TestFioVerify: fio writes a file on the mount with crc32c checksums in
// every block and reads it back through a 2 MiB page store, direct and
// buffered.
func TestFioVerify(t *testing.T) {
	need(t, "fio")
	e := mount(t, startNode(t, 0), "", 2<<20)
	for _, direct := range []int{1, 0} {
		t.Run(fmt.Sprintf("direct=%d", direct), func(t *testing.T) {
			out, err := exec.Command("fio", "--name=fsjob", "--filename="+e.path(fmt.Sprintf("fio%d", direct)),
				"--size=32M", "--bs=4k", "--rw=randwrite", "--ioengine=psync", fmt.Sprintf("--direct=%d", direct),
				"--verify=crc32c", "--verify_fatal=1", "--verify_state_save=0", "--do_verify=1", "--numjobs=1", "--randrepeat=0",
				"--output-format=terse").CombinedOutput()
			require.NoError(t, err, "%s", out)
			assert.NotContains(t, string(out), "verify", "%s", out)
		})
	}
}

// TestSQLite: a write workload in a database on the mount passes
// integrity_check, and again after a remount.
func TestSQLite(t *testing.T) {
	need(t, "sqlite3")
	addr := startNode(t, 0)
	e := mount(t, addr, "", 1<<20)
	db := e.path("test.db")
	var sql strings.Builder
	sql.WriteString("PRAGMA journal_mode=DELETE; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, n INTEGER);\n")
	for i := range 200 {
		fmt.Fprintf(&sql, "BEGIN; INSERT INTO t(v, n) SELECT hex(randomblob(200)), %d FROM generate_series(1, 50); UPDATE t SET n = n + 1 WHERE id %% 7 = %d; DELETE FROM t WHERE id %% 13 = %d; COMMIT;\n", i, i%7, i%13)
	}
	run := func(script string) string {
		t.Helper()
		cmd := exec.Command("sqlite3", db)
		cmd.Stdin = strings.NewReader(script)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		return strings.TrimSpace(string(out))
	}
	run(sql.String())
	check := "PRAGMA integrity_check; SELECT count(*), sum(n) FROM t;"
	got := run(check)
	assert.True(t, strings.HasPrefix(got, "ok\n"), "%s", got)
	dir := e.dir
	e.unmount()
	e = mount(t, addr, dir, 1<<20)
	assert.Equal(t, got, run(check), "the database differs after remount")
}
