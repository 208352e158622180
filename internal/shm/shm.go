// Package shm maps shared memory and gives atomic views of words inside it.
// It is the only pd3 package that uses unsafe and mmap, so the rules live in
// one place:
//
//   - A Region is a MAP_SHARED mapping of a memfd (anonymous, for one
//     process) or of a file in /dev/shm (named, shared by the host and the
//     DPU agent process).
//   - Words accessed with U64 must be 8-byte aligned; the mapping is
//     page-aligned, so layout offsets that are multiples of 8 are.
//   - Memory outside the Go heap is not seen by the race detector: code
//     that shares bytes through a Region must follow a ring discipline
//     (state words with atomics; plain copies only of bytes that the state
//     word protects).
package shm

import (
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Region is a shared mapping.
type Region struct {
	b    []byte
	f    *os.File
	path string
}

// Dir is where named regions live.
const Dir = "/dev/shm"

// Path returns the file backing the named region.
func Path(name string) string { return filepath.Join(Dir, "pd3-"+name) }

// Create makes a zero-filled region of size bytes. With name == "" it is
// anonymous (memfd); otherwise it is /dev/shm/pd3-NAME, replaced if it
// exists.
func Create(name string, size int) (*Region, error) {
	var f *os.File
	if name == "" {
		fd, err := unix.MemfdCreate("pd3", unix.MFD_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("shm: memfd_create: %w", err)
		}
		f = os.NewFile(uintptr(fd), "memfd:pd3")
	} else {
		p := Path(name)
		os.Remove(p)
		var err error
		f, err = os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("shm: %w", err)
		}
	}
	if err := f.Truncate(int64(size)); err != nil {
		f.Close()
		return nil, fmt.Errorf("shm: sizing %s: %w", f.Name(), err)
	}
	return mapFile(f, size, name)
}

// Open maps an existing named region.
func Open(name string) (*Region, error) {
	f, err := os.OpenFile(Path(name), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("shm: %w", err)
	}
	return mapFile(f, int(fi.Size()), name)
}

func mapFile(f *os.File, size int, name string) (*Region, error) {
	if size <= 0 {
		f.Close()
		return nil, fmt.Errorf("shm: region %s is empty", f.Name())
	}
	b, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("shm: mmap %s: %w", f.Name(), err)
	}
	r := &Region{b: b, f: f}
	if name != "" {
		r.path = Path(name)
	}
	return r, nil
}

// Bytes returns the mapping; it is valid until Close.
func (r *Region) Bytes() []byte { return r.b }

// Close unmaps the region. A named region's file stays until Remove.
func (r *Region) Close() error {
	err := unix.Munmap(r.b)
	r.f.Close()
	return err
}

// Remove deletes a named region's file (mappings stay valid).
func (r *Region) Remove() error {
	if r.path == "" {
		return nil
	}
	return os.Remove(r.path)
}

// U64 returns an atomic view of the 8 bytes at b[off:]. off must be a
// multiple of 8 and b must come from a Region (or another 8-aligned base).
func U64(b []byte, off int) *atomic.Uint64 {
	if off%8 != 0 || off+8 > len(b) {
		panic(fmt.Sprintf("shm: bad word offset %d in %d bytes", off, len(b)))
	}
	return (*atomic.Uint64)(unsafe.Pointer(&b[off]))
}

// U32 returns an atomic view of the 4 bytes at b[off:] (off a multiple of 4).
func U32(b []byte, off int) *atomic.Uint32 {
	if off%4 != 0 || off+4 > len(b) {
		panic(fmt.Sprintf("shm: bad word offset %d in %d bytes", off, len(b)))
	}
	return (*atomic.Uint32)(unsafe.Pointer(&b[off]))
}

const (
	futexWait = 0
	futexWake = 1
)

// FutexWait sleeps while *w == val, for at most timeout (0: no limit). It
// works across processes that map the same region (a shared futex). It
// returns on wake-up, timeout, signal or a changed value; callers re-check.
func FutexWait(w *atomic.Uint32, val uint32, timeout time.Duration) {
	var ts *unix.Timespec
	if timeout > 0 {
		t := unix.NsecToTimespec(int64(timeout))
		ts = &t
	}
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWait, uintptr(val), uintptr(unsafe.Pointer(ts)), 0, 0)
}

// FutexWake wakes up to n sleepers on w.
func FutexWake(w *atomic.Uint32, n int) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWake, uintptr(n), 0, 0, 0)
}

// Residency calls fn with the page-cache residency of each page of the
// n-byte file f (mincore over a read-only mapping), in windows of 1 GiB
// so that terabyte sparse files cost no more than a window's vector.
func Residency(f *os.File, n int64, fn func(page int64, resident bool)) error {
	const window = 1 << 30
	vec := make([]byte, window/4096)
	for off := int64(0); off < n; off += window {
		size := int(min(window, n-off))
		mem, err := unix.Mmap(int(f.Fd()), off, size, unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return fmt.Errorf("shm: mapping %s: %w", f.Name(), err)
		}
		pages := (size + 4095) / 4096
		_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(unsafe.SliceData(mem))), uintptr(size), uintptr(unsafe.Pointer(unsafe.SliceData(vec))))
		unix.Munmap(mem)
		if e != 0 {
			return fmt.Errorf("shm: mincore %s: %w", f.Name(), e)
		}
		for i, v := range vec[:pages] {
			fn(off/4096+int64(i), v&1 != 0)
		}
	}
	return nil
}
