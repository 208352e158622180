package memnode

import (
	"context"
	"errors"
	"fmt"

	"github.com/pd3-go/pd3/pageid"
)

// Per-request errors. The server returns them as a Status in the response and
// the client turns the Status back into the same sentinel, so callers branch
// with errors.Is whichever side of the wire they are on. The errors every
// layer shares are pageid's: a volume that does not exist (ErrNoVolume),
// bytes past its end (ErrOutOfRange), a name taken (ErrExists), no memory
// (ErrNoMemory), no disk room at a persistent node (ErrNoSpace), a write
// fenced by a newer holder (ErrFenced), a page whose bytes no longer match
// the checksum the node kept when they were written (ErrCorrupt). A connection broken with requests
// in flight fails them with pageid.ErrUnavailable (the client redials on
// the next request), and a closed client with pageid.ErrClosed.
var (
	// ErrUnauthorised is returned when HELLO carries a wrong token or a
	// request arrives before HELLO (the connection is closed afterwards),
	// and per request when a connection touches a volume outside its
	// grant (Server.Grants).
	ErrUnauthorised = errors.New("memnode: unauthorised")
	// ErrUnknownOp is returned for an operation code the node does not know.
	ErrUnknownOp = errors.New("memnode: unknown operation")
	// ErrBadRequest is returned for a well-framed request whose fields make
	// no sense (bad name, wrong payload size for the op).
	ErrBadRequest = errors.New("memnode: bad request")
	// ErrTooLarge is returned when a request moves more than MaxIO bytes.
	ErrTooLarge = errors.New("memnode: request too large")
	// ErrVersion is returned when HELLO names a protocol version the node
	// does not speak.
	ErrVersion = errors.New("memnode: protocol version mismatch")
	// ErrMisaligned is returned when CAS/FAA target a word that is not
	// 8-byte aligned.
	ErrMisaligned = errors.New("memnode: misaligned atomic")
	// ErrNoWindow is returned when a data op names no memory window bound
	// on its connection, or one that does not cover the bytes or allow the
	// access (a window key is worthless on another connection).
	ErrNoWindow = errors.New("memnode: no memory window grants this access")
	// ErrTLSRequired answers a HELLO sent in clear to a node that serves
	// TLS (Server.TLS); the connection is closed afterwards.
	ErrTLSRequired = errors.New("memnode: the node requires TLS")
)

// Connection-level errors.
var (
	// ErrFraming is returned when a byte stream does not decode as frames;
	// the connection carrying it is closed.
	ErrFraming = errors.New("memnode: framing violation")
	// ErrProtocol is returned when a response does not match its request.
	ErrProtocol = errors.New("memnode: protocol error")
)

var statusErrs = [...]error{
	StatusOutOfRange:   pageid.ErrOutOfRange,
	StatusNoVolume:     pageid.ErrNoVolume,
	StatusUnauthorised: ErrUnauthorised,
	StatusNoMemory:     pageid.ErrNoMemory,
	StatusUnknownOp:    ErrUnknownOp,
	StatusBadRequest:   ErrBadRequest,
	StatusTooLarge:     ErrTooLarge,
	StatusExists:       pageid.ErrExists,
	StatusVersion:      ErrVersion,
	StatusMisaligned:   ErrMisaligned,
	StatusNoWindow:     ErrNoWindow,
	StatusTLSRequired:  ErrTLSRequired,
	StatusFenced:       pageid.ErrFenced,
	StatusNoSpace:      pageid.ErrNoSpace,
	StatusCorrupt:      pageid.ErrCorrupt,
}

// Err returns the sentinel for s, or nil for StatusOK.
func (s Status) Err() error {
	if s == StatusOK {
		return nil
	}
	if int(s) < len(statusErrs) && statusErrs[s] != nil {
		return statusErrs[s]
	}
	return fmt.Errorf("%w: unknown status %d", ErrProtocol, uint8(s))
}

func (s Status) String() string {
	if s == StatusOK {
		return "OK"
	}
	return s.Err().Error()
}

// StatusOf is the one place that maps errors to wire status codes; ok is
// false for an error no status names (a broken connection, a timeout, a
// cancelled context), which a server answers as StatusBadRequest.
func StatusOf(err error) (s Status, ok bool) {
	if err == nil {
		return StatusOK, true
	}
	for s, e := range statusErrs {
		if e != nil && errors.Is(err, e) {
			return Status(s), true
		}
	}
	return StatusBadRequest, false
}

func statusOf(err error) Status {
	s, _ := StatusOf(err)
	return s
}

// NodeFault says whether err condemns the node's copy rather than the
// request, for layers that keep data on many nodes (replicas, erasure-coded
// shards) and go to another copy on a node's fault: the node is
// unreachable or silent, lost the volume, or holds a corrupt page. A
// fenced write (the caller was superseded), a request the node finds
// malformed, or the caller giving up are the request's.
func NodeFault(ctx context.Context, err error) bool {
	switch {
	case ctx.Err() != nil,
		errors.Is(err, pageid.ErrFenced), errors.Is(err, pageid.ErrOutOfRange),
		errors.Is(err, ErrTooLarge), errors.Is(err, ErrMisaligned),
		errors.Is(err, ErrBadRequest), errors.Is(err, pageid.ErrClosed):
		return false
	}
	return true
}
