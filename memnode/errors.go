package memnode

import (
	"errors"
	"fmt"

	"github.com/pd3-go/pd3/pageid"
)

// Per-request errors. The server returns them as a Status in the response and
// the client turns the Status back into the same sentinel, so callers branch
// with errors.Is whichever side of the wire they are on.
var (
	// ErrOutOfRange is returned when a request touches bytes past the end of
	// its volume (pageid's sentinel: every layer reports it alike).
	ErrOutOfRange = pageid.ErrOutOfRange
	// ErrNoVolume is returned when a volume id or name does not exist.
	ErrNoVolume = pageid.ErrNoVolume
	// ErrUnauthorised is returned when HELLO carries a wrong token or a
	// request arrives before HELLO (the connection is closed afterwards),
	// and per request when a connection touches a volume outside its
	// grant (Server.Grants).
	ErrUnauthorised = errors.New("memnode: unauthorised")
	// ErrNoMemory is returned when the node has no room for a new chunk.
	ErrNoMemory = errors.New("memnode: out of memory")
	// ErrUnknownOp is returned for an operation code the node does not know.
	ErrUnknownOp = errors.New("memnode: unknown operation")
	// ErrBadRequest is returned for a well-framed request whose fields make
	// no sense (bad name, wrong payload size for the op).
	ErrBadRequest = errors.New("memnode: bad request")
	// ErrTooLarge is returned when a request moves more than MaxIO bytes.
	ErrTooLarge = errors.New("memnode: request too large")
	// ErrExists is returned when creating a volume whose name is taken.
	ErrExists = errors.New("memnode: volume exists")
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
	// ErrFenced is returned for a write through a window whose fencing
	// token is older than the newest one presented for its volume: another
	// host has taken the volume over.
	ErrFenced = errors.New("memnode: write fenced: a newer holder of the volume's lease has presented its token")
	// ErrNoSpace is returned for a mutation a persistent node (--persist)
	// has no disk room to log. Reads go on; writes are taken again, with
	// no restart, once room returns.
	ErrNoSpace = errors.New("memnode: no space left on the node's disk (--persist); free room there and writes resume")
)

// Connection-level errors.
var (
	// ErrFraming is returned when a byte stream does not decode as frames;
	// the connection carrying it is closed.
	ErrFraming = errors.New("memnode: framing violation")
	// ErrProtocol is returned when a response does not match its request.
	ErrProtocol = errors.New("memnode: protocol error")
	// ErrConnLost is returned for requests that were in flight, or are
	// issued, while the connection to the node is broken. The client
	// redials on the next request.
	ErrConnLost = errors.New("memnode: connection to memory node lost")
	// ErrClosed is returned after Client.Close.
	ErrClosed = errors.New("memnode: client closed")
)

var statusErrs = [...]error{
	StatusOutOfRange:   ErrOutOfRange,
	StatusNoVolume:     ErrNoVolume,
	StatusUnauthorised: ErrUnauthorised,
	StatusNoMemory:     ErrNoMemory,
	StatusUnknownOp:    ErrUnknownOp,
	StatusBadRequest:   ErrBadRequest,
	StatusTooLarge:     ErrTooLarge,
	StatusExists:       ErrExists,
	StatusVersion:      ErrVersion,
	StatusMisaligned:   ErrMisaligned,
	StatusNoWindow:     ErrNoWindow,
	StatusTLSRequired:  ErrTLSRequired,
	StatusFenced:       ErrFenced,
	StatusNoSpace:      ErrNoSpace,
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
