package pagestore

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// frameMemory returns size bytes for the cache's frames: in the Go heap
// if inHeap, else mapped outside it and unmapped once the store is
// unreachable.
//
// Outside the heap is the default (framesInHeap): in the heap the frames
// count in what the collector paces itself by, which lets garbage grow to
// as much again as is live before it collects, so a host's RSS grew with
// its cache's size twice (docs/decisions.md, 42). Pages are touched, and
// so resident, as frames are first used. Nothing outlives the store with
// a slice of them: a page is copied out under its frame's lock, and a
// remote read into a frame holds the store through its completion.
//
// Under the race detector, which watches only the heap, the frames stay
// in it, so that tests keep checking every access to page bytes.
func frameMemory(owner *Store, size int, inHeap bool) ([]byte, error) {
	if inHeap {
		return make([]byte, size), nil
	}
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("pagestore: mapping %d bytes for the cache: %w", size, err)
	}
	runtime.AddCleanup(owner, func(b []byte) { unix.Munmap(b) }, b)
	return b, nil
}
