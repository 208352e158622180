// Package stages timestamps the stages of one request as it crosses pd3's
// processes — benchmark client, host, memory node — for the miss-path
// breakdown (`pd3 bench nbd --breakdown`).
//
// The stamps live in a small shared-memory region (internal/shm) that every
// process of a run maps by name, so one request's stages, stamped by three
// processes, can be read side by side. Each stage keeps only its latest
// stamp: the breakdown runs one request at a time (queue depth 1), reads
// the stamps after each reply, and keeps the requests in which every stage
// it expects was stamped after the request was sent.
//
// A nil *Recorder records nothing; that is the production setting, and a
// stamp then costs one nil check.
package stages

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/internal/shm"
)

// Stage is one point on a request's path, in path order.
type Stage int

// The stages of a one-page NBD READ. A hit skips the memory node's stages
// (HostRemoteSent … HostRemoteDone).
const (
	ClientSent       Stage = iota // the client is about to write the request
	HostRequestRead               // the host's NBD reader has the request header
	HostDispatched                // the request is validated and handed to the page store
	HostRemoteSent                // the page missed; its memory-node READ is about to be written
	NodeRequestRead               // the memory node has the READ's header
	NodeServed                    // the page is copied into the response
	NodeReplyWritten              // the response is about to be written
	HostRemoteDone                // the host has read the response; its call completes
	HostReplyWritten              // the NBD reply is about to be written
	ClientReceived                // the client has read the whole reply
	NumStages
)

var names = [NumStages]string{
	"client sends", "host: request read", "host: dispatched", "host: miss, memnode READ issued",
	"node: request read", "node: served", "node: response issued",
	"host: response read", "host: reply issued", "client received",
}

func (s Stage) String() string {
	if s < 0 || s >= NumStages {
		return fmt.Sprintf("stage(%d)", int(s))
	}
	return names[s]
}

// Recorder holds the latest stamp of every stage.
type Recorder struct {
	region *shm.Region
	w      [NumStages]*atomic.Uint64
	owner  bool
}

const regionSize = 4096

// Create makes the named region (the benchmark does, before it starts the
// processes it measures).
func Create(name string) (*Recorder, error) {
	r, err := shm.Create(name, regionSize)
	if err != nil {
		return nil, fmt.Errorf("stage recorder: %w", err)
	}
	return newRecorder(r, true), nil
}

// Open maps a region another process created.
func Open(name string) (*Recorder, error) {
	r, err := shm.Open(name)
	if err != nil {
		return nil, fmt.Errorf("stage recorder: %w", err)
	}
	return newRecorder(r, false), nil
}

func newRecorder(r *shm.Region, owner bool) *Recorder {
	rec := &Recorder{region: r, owner: owner}
	b := r.Bytes()
	for i := range rec.w {
		// One cache line each: several processes stamp.
		rec.w[i] = shm.U64(b, 64*i)
	}
	return rec
}

// Stamp records now as the latest time of s.
func (r *Recorder) Stamp(s Stage) {
	if r == nil {
		return
	}
	r.w[s].Store(uint64(time.Now().UnixNano()))
}

// At returns the latest stamp of s (Unix nanoseconds; 0: never).
func (r *Recorder) At(s Stage) int64 { return int64(r.w[s].Load()) }

// Close unmaps the region, and removes it if this process created it.
func (r *Recorder) Close() error {
	if r == nil {
		return nil
	}
	if r.owner {
		r.region.Remove()
	}
	return r.region.Close()
}
