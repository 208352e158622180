package fs_test

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pd3-go/pd3/fs"
)

// nobody is a caller without CAP_FSETID, outside root's group.
const nobody = 65534

// asNobody runs sh -c script with $1 = p as user and group nobody.
func asNobody(t *testing.T, script, p string) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script, "sh", p)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
}

// searchable lets nobody reach files under dir: the test's temporary
// directories are private to root.
func searchable(t *testing.T, dir string) {
	t.Helper()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		require.NoError(t, os.Chmod(d, 0o755))
	}
}

// The mount clears set-user-ID and set-group-ID bits itself
// (FUSE_HANDLE_KILLPRIV_V2, fs/killpriv.go), where the kernel used to.
// Every case runs on a local filesystem too, and the mount must leave the
// same mode as it, and the mode written here.
func TestSetIDBitsClearedAsLocally(t *testing.T) {
	e := mount(t, startNode(t, 0), "", 0)
	local := t.TempDir()
	searchable(t, local)
	searchable(t, e.dir)
	for _, tc := range []struct {
		name string
		mode os.FileMode // with os.ModeSetuid etc.
		act  func(t *testing.T, p string)
		dir  bool
		want uint32
	}{
		{"unprivileged write", 0o6777, func(t *testing.T, p string) { asNobody(t, `printf x >> "$1"`, p) }, false, 0o777},
		{"unprivileged write, set-group-ID without group execute, writer outside the group", 0o2767,
			func(t *testing.T, p string) { asNobody(t, `printf x >> "$1"`, p) }, false, 0o767},
		{"unprivileged O_DIRECT write", 0o4777, func(t *testing.T, p string) {
			asNobody(t, `dd if=/dev/zero of="$1" bs=4096 count=1 oflag=direct conv=notrunc 2>/dev/null`, p)
		}, false, 0o777},
		{"unprivileged write, set-group-ID without group execute, writer in the group", 0o2767, func(t *testing.T, p string) {
			require.NoError(t, os.Chown(p, 0, nobody))
			asNobody(t, `printf x >> "$1"`, p)
		}, false, 0o2767},
		{"root's write keeps them", 0o6777, func(t *testing.T, p string) {
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			require.NoError(t, err)
			_, err = f.WriteString("x")
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}, false, 0o6777},
		{"unprivileged truncate", 0o4777, func(t *testing.T, p string) { asNobody(t, `truncate -s 1 "$1"`, p) }, false, 0o777},
		{"unprivileged O_TRUNC open", 0o6777, func(t *testing.T, p string) { asNobody(t, `: > "$1"`, p) }, false, 0o777},
		{"chown", 0o6755, func(t *testing.T, p string) { require.NoError(t, os.Chown(p, nobody, nobody)) }, false, 0o755},
		{"chown keeps set-group-ID without group execute", 0o2745, func(t *testing.T, p string) {
			require.NoError(t, os.Chown(p, nobody, nobody))
		}, false, 0o2745},
		{"chown of a directory keeps them", 0o2775, func(t *testing.T, p string) {
			require.NoError(t, os.Chown(p, nobody, nobody))
		}, true, 0o2775},
		{"chmod sets them", 0o755, func(t *testing.T, p string) { require.NoError(t, os.Chmod(p, 0o4755|os.ModeSetuid)) }, false, 0o4755},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, root := range []string{local, e.dir} {
				p := filepath.Join(root, filepath.Base(t.Name()))
				if tc.dir {
					require.NoError(t, os.Mkdir(p, 0o755))
				} else {
					require.NoError(t, os.WriteFile(p, []byte("data"), 0o644))
				}
				require.NoError(t, unix.Chmod(p, uint32(tc.mode)))
				tc.act(t, p)
				var st unix.Stat_t
				require.NoError(t, unix.Stat(p, &st))
				assert.Equal(t, tc.want, st.Mode&0o7777, "%s: mode %#o", root, st.Mode&0o7777)
			}
		})
	}
}

// A write removes a file's capabilities, also after writes that let the
// kernel stop asking for them (it asks again once they are set): the
// kernel still does this part itself, through the mount.
func TestWriteRemovesFileCapabilities(t *testing.T) {
	e := mount(t, startNode(t, 0), "", 0)
	// vfs_cap_data, revision 2: CAP_NET_BIND_SERVICE permitted.
	cap := make([]byte, 20)
	binary.LittleEndian.PutUint32(cap[0:], 0x02000000)
	binary.LittleEndian.PutUint32(cap[4:], 1<<unix.CAP_NET_BIND_SERVICE)
	for _, root := range []string{t.TempDir(), e.dir} {
		p := filepath.Join(root, "f")
		f, err := os.Create(p)
		require.NoError(t, err)
		for range 3 {
			_, err = f.WriteString("before")
			require.NoError(t, err)
		}
		require.NoError(t, unix.Setxattr(p, "security.capability", cap, 0), root)
		n, err := unix.Getxattr(p, "security.capability", make([]byte, 64))
		require.NoError(t, err, root)
		require.Equal(t, len(cap), n)
		_, err = f.WriteString("after")
		require.NoError(t, err)
		require.NoError(t, f.Close())
		_, err = unix.Getxattr(p, "security.capability", make([]byte, 64))
		assert.ErrorIs(t, err, unix.ENODATA, "%s: the capability outlived a write", root)
	}
}

// Buffered writes cost no GETXATTR each: the kernel asked the mount for
// security.capability before every write(2) until the mount took the
// clearing of set-ID bits over; now it asks about once per file.
func TestWritesDoNotAskForCapabilities(t *testing.T) {
	e := mount(t, startNode(t, 0), "", 0)
	f, err := os.Create(e.path("f"))
	require.NoError(t, err)
	before := fs.Getxattrs(e.m)
	page := make([]byte, 4096)
	const writes = 200
	for range writes {
		_, err := f.Write(page)
		require.NoError(t, err)
	}
	require.NoError(t, f.Close())
	asked := fs.Getxattrs(e.m) - before
	assert.LessOrEqual(t, asked, uint64(2), "GETXATTRs for %d writes", writes)
}

// TestOverwritesAndFsyncsAskNoCapabilities: a database that overwrites a
// page and fsyncs it, again and again, costs no GETXATTR per write. An
// fsync drops the kernel's attributes (and with them its knowledge that
// the file has no capabilities) only when the blocks they show changed,
// and then the next stat shows the new ones.
func TestOverwritesAndFsyncsAskNoCapabilities(t *testing.T) {
	e := mount(t, startNode(t, 0), "", 0)
	f, err := os.Create(e.path("db"))
	require.NoError(t, err)
	defer f.Close()
	page := bytes.Repeat([]byte{1}, 4096)
	for i := range 8 {
		_, err := f.WriteAt(page, int64(i)*4096)
		require.NoError(t, err)
	}
	require.NoError(t, f.Sync())
	var st syscall.Stat_t
	require.NoError(t, syscall.Fstat(int(f.Fd()), &st))
	require.EqualValues(t, 1<<20, st.Blocks*512, "one chunk stored")

	before := fs.Getxattrs(e.m)
	const cycles = 50
	for i := range cycles {
		page[0] = byte(i)
		_, err := f.WriteAt(page, 3*4096)
		require.NoError(t, err)
		require.NoError(t, f.Sync())
	}
	asked := fs.Getxattrs(e.m) - before
	assert.LessOrEqual(t, asked, uint64(2), "GETXATTRs for %d overwrites, each fsynced", cycles)

	_, err = f.WriteAt(page, 5<<20) // a second chunk
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, syscall.Fstat(int(f.Fd()), &st))
	assert.EqualValues(t, 2<<20, st.Blocks*512, "the stat after an fsync that stored more shows it")
}
