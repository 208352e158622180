package memnode

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// disk is the filesystem a persistent store keeps its directory on: the
// operating system's (osDisk), or in the crash-point tests a recorder of
// every operation that builds the states a crash could leave.
type disk interface {
	OpenFile(name string, flag int) (diskFile, error)
	ReadFile(name string) ([]byte, error)
	Remove(name string) error
	Rename(oldname, newname string) error
	Truncate(name string, size int64) error
	MkdirAll(dir string) error
	// Names lists the names in dir.
	Names(dir string) ([]string, error)
	Stat(name string) (os.FileInfo, error)
	// SyncDir makes the names created, removed or renamed in dir durable.
	SyncDir(dir string) error
}

// diskFile is an open file of a disk. Write writes at the file's own
// position (no O_APPEND).
type diskFile interface {
	Write(p []byte) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	ReadAt(p []byte, off int64) (int, error)
	// Datasync is fdatasync(2); Sync is fsync(2).
	Datasync() error
	Sync() error
	// PunchHole deallocates n bytes at off, keeping the size; Allocate
	// allocates them (fallocate(2)).
	PunchHole(off, n int64) error
	Allocate(off, n int64) error
	// SeekData is lseek(SEEK_DATA): the first offset at or after off that
	// holds data, or an error (ENXIO) when none does.
	SeekData(off int64) (int64, error)
	Stat() (os.FileInfo, error)
	Close() error
}

// osDisk is the operating system's filesystem.
type osDisk struct{}

func (osDisk) OpenFile(name string, flag int) (diskFile, error) {
	f, err := os.OpenFile(name, flag, 0o600)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osDisk) ReadFile(name string) ([]byte, error)   { return os.ReadFile(name) }
func (osDisk) Remove(name string) error               { return os.Remove(name) }
func (osDisk) Rename(oldname, newname string) error   { return os.Rename(oldname, newname) }
func (osDisk) Truncate(name string, size int64) error { return os.Truncate(name, size) }
func (osDisk) MkdirAll(dir string) error              { return os.MkdirAll(dir, 0o700) }
func (osDisk) Stat(name string) (os.FileInfo, error)  { return os.Stat(name) }

func (osDisk) Names(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	return names, nil
}

func (osDisk) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("syncing directory %s: %w", dir, err)
	}
	return nil
}

type osFile struct{ *os.File }

func (f osFile) Datasync() error { return unix.Fdatasync(int(f.Fd())) }

func (f osFile) PunchHole(off, n int64) error {
	return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
}

func (f osFile) Allocate(off, n int64) error {
	return unix.Fallocate(int(f.Fd()), 0, off, n)
}

func (f osFile) SeekData(off int64) (int64, error) {
	return unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
}
