//go:build !race

package pagestore

// framesInHeap: the cache's frames are mapped outside the Go heap
// (frames.go).
const framesInHeap = false
