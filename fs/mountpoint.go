package fs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// ErrMountPointInUse means the mount point holds a live mount: another
// running pd3, or another filesystem.
var ErrMountPointInUse = errors.New("mount point in use")

// fsType is the type the kernel lists for our mounts (FUSE's "fuse." and
// MountOptions.Name).
const fsType = "fuse.pd3"

// PrepareMountPoint makes dir ready for Mount. It creates dir when it is
// missing. A pd3 mount whose process died without unmounting (SIGKILL, a
// crash) leaves a dead mount whose every access fails with ENOTCONN; that
// one is detached, and stale reports it so the caller can say so. A live
// mount, or any other filesystem's mount, is refused with
// ErrMountPointInUse rather than stacked on or torn down.
func PrepareMountPoint(dir string) (stale bool, err error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false, fmt.Errorf("fs: mount point %s: %w", dir, err)
	}
	m, found, err := mountAt(abs)
	if err != nil {
		return false, fmt.Errorf("fs: mount point %s: %w", dir, err)
	}
	// statfs(2) always reaches the filesystem's server, where stat(2) may
	// be answered from attributes the kernel still caches.
	var st syscall.Statfs_t
	statErr := syscall.Statfs(abs, &st)
	dead := errors.Is(statErr, syscall.ENOTCONN)
	switch {
	case found && m.fsType == fsType && dead:
		if err := detach(abs); err != nil {
			return false, fmt.Errorf("fs: a stale pd3 mount is left at %s (its process ended without unmounting) and could not be detached: %w", dir, err)
		}
		stale = true
	case found && m.fsType == fsType:
		return false, fmt.Errorf("fs: %w: %s is mounted by a running pd3 (%s): stop it, or choose another mount point", ErrMountPointInUse, dir, m.source)
	case found:
		hint := "unmount it"
		if dead {
			hint = "its server is gone: fusermount3 -u " + dir
		}
		return false, fmt.Errorf("fs: %w: %s is already a mount point (%s from %s): %s, or choose another mount point", ErrMountPointInUse, dir, m.fsType, m.source, hint)
	case dead:
		return false, fmt.Errorf("fs: %s: %w (a dead FUSE mount in another mount namespace?)", dir, os.NewSyscallError("statfs", statErr))
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return stale, fmt.Errorf("fs: mount point: %w", err)
	}
	return stale, nil
}

// Hides is how many entries of dir a mount there would hide (up to 1000;
// 0 for a missing or unreadable directory).
func Hides(dir string) int {
	d, err := os.Open(dir)
	if err != nil {
		return 0
	}
	defer d.Close()
	names, _ := d.Readdirnames(1000)
	return len(names)
}

// detach lazily unmounts dir (a dead mount, or a busy one at unmount):
// with umount2(2) as root, else with the setuid helper.
func detach(dir string) error {
	err := syscall.Unmount(dir, syscall.MNT_DETACH)
	if err == nil {
		return nil
	}
	if out, err2 := exec.Command("fusermount3", "-u", "-z", dir).CombinedOutput(); err2 != nil {
		return fmt.Errorf("umount: %v; fusermount3: %v (%s)", err, err2, strings.TrimSpace(string(out)))
	}
	return nil
}

type mountEntry struct{ fsType, source string }

// mountAt returns the topmost mount at dir from /proc/self/mountinfo.
// Read here rather than with prometheus/procfs: its parser keeps
// mountinfo's octal escapes (\040 for a space), so a mount point with a
// space would never match.
func mountAt(dir string) (m mountEntry, found bool, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return m, false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		e, point, ok := parseMountinfo(sc.Text())
		if ok && point == dir {
			m, found = e, true // later lines are mounted on top
		}
	}
	return m, found, sc.Err()
}

// parseMountinfo reads one line of proc(5)'s mountinfo: field 5 is the
// mount point; after the "-" separator come the type and the source.
func parseMountinfo(line string) (e mountEntry, point string, ok bool) {
	fs := strings.Fields(line)
	sep := -1
	for i := 6; i < len(fs); i++ {
		if fs[i] == "-" {
			sep = i
			break
		}
	}
	if sep < 0 || sep+2 >= len(fs) { // sep ≥ 6: the mount point is there too
		return e, "", false
	}
	return mountEntry{fsType: unescape(fs[sep+1]), source: unescape(fs[sep+2])}, unescape(fs[4]), true
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
