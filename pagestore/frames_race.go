//go:build race

package pagestore

// framesInHeap: the race detector watches only the Go heap (frames.go).
const framesInHeap = true
