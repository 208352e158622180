package fs

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// KernelReadAhead is how far the kernel reads ahead of a sequential
// reader of a pd3 mount: as far as one READ carries (maxIO). A FUSE
// mount's backing device starts at the kernel's default of 128 KiB, and
// FUSE_INIT's max_readahead can only lower it, so a mount that could take
// 1 MiB READs was sent 128 KiB ones and a reader waited on eight round
// trips for what one brings (docs/decisions.md, 34).
const KernelReadAhead = maxIO

// SetKernelReadAhead sets the read-ahead of the FUSE mount at dir to
// KernelReadAhead, through its backing device's read_ahead_kb in sysfs
// (root only). It returns the setting the mount had before.
func SetKernelReadAhead(dir string) (was int, err error) {
	p, err := bdiReadAheadPath(dir)
	if err != nil {
		return 0, err
	}
	if was, err = readAheadAt(p); err != nil {
		return 0, err
	}
	if err := os.WriteFile(p, []byte(strconv.Itoa(KernelReadAhead>>10)), 0); err != nil {
		return was, fmt.Errorf("fs: setting the kernel's read-ahead of %s: %w", dir, err)
	}
	return was, nil
}

// KernelReadAheadOf is the read-ahead in bytes of the mount at dir.
func KernelReadAheadOf(dir string) (int, error) {
	p, err := bdiReadAheadPath(dir)
	if err != nil {
		return 0, err
	}
	return readAheadAt(p)
}

// readAheadAt reads the read-ahead in bytes from sysfs file p.
func readAheadAt(p string) (int, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, fmt.Errorf("fs: the kernel's read-ahead: %w", err)
	}
	kb, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("fs: %s: %w", p, err)
	}
	return kb << 10, nil
}

// bdiReadAheadPath is the sysfs file of the read-ahead of the backing
// device of the FUSE mount at dir: FUSE names it MAJOR:MINOR of the
// mount's anonymous device.
func bdiReadAheadPath(dir string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return "", fmt.Errorf("fs: %w", err)
	}
	return fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev)), nil
}
