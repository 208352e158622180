package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"time"

	"github.com/pd3-go/pd3/internal/sockio"
)

// The crossing floor: the least a read can cost on this machine when it
// crosses processes the way a pd3 read does, measured with Go processes
// that do no work but pass NBD-sized frames (a 28-byte request, a 16-byte
// header with a 4 KiB page back) over loopback TCP. An echo process
// answers; a relay process forwards each request to the echo process and
// the answer back (a miss's four crossings: client, host, node, host,
// client). Each process either sleeps in poll(2) for its input, as pd3
// does, or busy-polls its socket without ever sleeping, as an RDMA client
// polls its completion queue: the lowest a polling design could reach here.
const (
	crossReqSize   = 28
	crossReplySize = 16 + 4096
)

// How a crossing process waits for its input.
type waitMode int

const (
	waitNetpoll waitMode = iota // Go's network poller (the breakdown's NBD client)
	waitPoll2                   // poll(2) on the socket (sockio, as pd3's servers)
	waitBusy                    // non-blocking reads in a loop, never sleeping
)

// crossReader reads a socket in one waitMode.
type crossReader struct {
	nc   net.Conn
	r    *sockio.Reader
	mode waitMode
}

func newCrossReader(nc net.Conn, mode waitMode) (*crossReader, error) {
	r := sockio.NewReader(nc)
	if r == nil {
		return nil, fmt.Errorf("crossing: %T is not a socket", nc)
	}
	if mode != waitNetpoll {
		r.Direct()
	}
	return &crossReader{nc: nc, r: r, mode: mode}, nil
}

// readFull fills p; busy-polling never sleeps however long the input takes.
func (c *crossReader) readFull(p []byte) error {
	for len(p) > 0 {
		var n int
		var err error
		switch c.mode {
		case waitBusy:
			// Yield between attempts: a spinner must not starve the
			// other goroutines of its own process (a relay's other
			// direction, or a test running every process in one).
			if n, err = c.r.TryRead(p); n == 0 && err == nil {
				runtime.Gosched()
			}
		case waitPoll2:
			n, err = c.r.Read(p)
		default:
			n, err = c.nc.Read(p)
		}
		if err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// ServeCrossing answers each 28-byte request on every connection of ln
// with a 4 KiB page; with forward set it relays each request there and
// the answer back instead. poll: "" sleeps in poll(2) for all input,
// "all" busy-polls for all input, "upstream" busy-polls only for the
// forwarded request's answer (a host that polls while a miss is
// outstanding and sleeps while idle). It returns when ctx ends.
//
// With proxy it is a byte relay to forward instead, for any protocol
// (NBD with its handshake): each direction is copied by a goroutine of
// its own that sleeps in poll(2) while the relay has one connection and
// in the network poller while it has more, as pd3's servers do under
// load; requests pipeline through it.
func ServeCrossing(ctx context.Context, ln net.Listener, forward string, poll string, proxy bool) error {
	in, up, err := crossingModes(forward, poll, proxy)
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); ln.Close() }()
	// The relay's connections: like pd3's servers, it waits in poll(2)
	// only while it relays for one of them (sockio.Reader.DirectIf), so
	// that a ceiling measured with many is not held back by its threads.
	var conns sockio.Busy
	for {
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			defer sockio.Close(nc)
			serve := func() error { return crossConn(ctx, nc, forward, in, up) }
			if proxy {
				serve = func() error { return proxyConn(ctx, nc, forward, &conns) }
			}
			if err := serve(); err != nil && !errors.Is(err, io.EOF) && ctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "crossing: %v\n", err)
			}
		}()
	}
}

func crossConn(ctx context.Context, nc net.Conn, forward string, inMode, upMode waitMode) error {
	in, err := newCrossReader(nc, inMode)
	if err != nil {
		return err
	}
	var up net.Conn
	var upr *crossReader
	if forward != "" {
		var d net.Dialer
		if up, err = d.DialContext(ctx, "tcp", forward); err != nil {
			return err
		}
		defer sockio.Close(up)
		if upr, err = newCrossReader(up, upMode); err != nil {
			return err
		}
	}
	req := make([]byte, crossReqSize)
	reply := make([]byte, crossReplySize)
	for {
		if err := in.readFull(req); err != nil {
			return err
		}
		if up != nil {
			if _, err := up.Write(req); err != nil {
				return err
			}
			if err := upr.readFull(reply); err != nil {
				return err
			}
		}
		if _, err := nc.Write(reply); err != nil {
			return err
		}
	}
}

// CheckCrossing checks ServeCrossing's settings, for a command line
// before it listens.
func CheckCrossing(forward, poll string, proxy bool) error {
	_, _, err := crossingModes(forward, poll, proxy)
	return err
}

// crossingModes checks ServeCrossing's settings and returns how the
// server waits for its client's input and for the forwarded answers.
func crossingModes(forward, poll string, proxy bool) (in, up waitMode, err error) {
	if proxy && (forward == "" || poll != "") {
		return 0, 0, fmt.Errorf("crossing: a proxy needs --forward and sleeps in poll(2)")
	}
	in, up = waitPoll2, waitPoll2
	switch poll {
	case "":
	case "all":
		in, up = waitBusy, waitBusy
	case "upstream":
		up = waitBusy
	default:
		return 0, 0, fmt.Errorf("crossing: --poll %q: want all or upstream", poll)
	}
	return in, up, nil
}

// proxyConn copies nc to a connection to forward and back until either
// side ends.
func proxyConn(ctx context.Context, nc net.Conn, forward string, conns *sockio.Busy) error {
	var d net.Dialer
	up, err := d.DialContext(ctx, "tcp", forward)
	if err != nil {
		return err
	}
	conns.Add(1)
	defer conns.Add(-1)
	errc := make(chan error, 2)
	copyTo := func(dst, src net.Conn) {
		r, err := newCrossReader(src, waitPoll2)
		if err != nil {
			errc <- err
			return
		}
		r.r.DirectIf(conns)
		buf := make([]byte, 256<<10)
		for {
			n, err := r.r.Read(buf)
			if err != nil {
				errc <- err
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				errc <- err
				return
			}
		}
	}
	go copyTo(up, nc)
	go copyTo(nc, up)
	err = <-errc
	sockio.Close(up)
	sockio.Close(nc)
	<-errc
	return err
}

// crossingRun sends n requests one at a time to addr and returns each
// one's latency in µs.
func crossingRun(ctx context.Context, addr string, n int, mode waitMode) ([]float64, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer sockio.Close(nc)
	// A read blocked in poll(2) or spinning ends when the socket does.
	defer context.AfterFunc(ctx, func() { sockio.Close(nc) })()
	r, err := newCrossReader(nc, mode)
	if err != nil {
		return nil, err
	}
	req := make([]byte, crossReqSize)
	reply := make([]byte, crossReplySize)
	lat := make([]float64, 0, n)
	for i := 0; i < n && ctx.Err() == nil; i++ {
		t0 := time.Now()
		if _, err := nc.Write(req); err != nil {
			return nil, err
		}
		if err := r.readFull(reply); err != nil {
			return nil, err
		}
		lat = append(lat, us(time.Since(t0)))
	}
	return lat, ctx.Err()
}

// crossingFloor is one row of the floor: hops 1 is client and echo, 2
// puts a relay between them; echo and relay wait as ServeCrossing's poll
// says (relayPoll for the relay), the client in client.
type crossingFloor struct {
	name, what          string
	hops                int
	echoPoll, relayPoll string
	client              waitMode
	proxy               bool // the relay copies each direction on a goroutine of its own
}

var crossingFloors = []crossingFloor{
	{"go-crossing", "the client and one Go process sleeping in poll(2): a hit's floor", 1, "", "", waitNetpoll, false},
	{"go-crossing-poll", "the same, both busy-polling", 1, "all", "", waitBusy, false},
	{"go-relay", "client, relay, echo (a miss's four crossings), sleeping in poll(2): a miss's floor as pd3 waits", 2, "", "", waitNetpoll, false},
	{"go-relay-two-threads", "the same through a relay whose answers come back on a second thread (as in pd3's host)", 2, "", "", waitNetpoll, true},
	{"go-relay-poll-outstanding", "the same, the relay busy-polling while its forwarded request is outstanding (idle stays idle)", 2, "", "upstream", waitNetpoll, false},
	{"go-relay-poll-servers", "the same, relay and echo busy-polling always, the client sleeping (as fio does)", 2, "all", "all", waitNetpoll, false},
	{"go-relay-poll", "the same, all three busy-polling", 2, "all", "all", waitBusy, false},
}

// runCrossingFloor starts the row's processes (pd3 bench crossing-server)
// and measures n requests.
func runCrossingFloor(ctx context.Context, exe string, f crossingFloor, n int) (BreakdownRow, error) {
	args := func(forward, poll string) []string {
		a := []string{"bench", "crossing-server", "--listen", "127.0.0.1:0"}
		if forward != "" {
			a = append(a, "--forward", forward)
			if f.proxy {
				a = append(a, "--proxy")
			}
		}
		if poll != "" {
			a = append(a, "--poll", poll)
		}
		return a
	}
	echo, err := StartChildEnv(ctx, exe, nil, []string{"crossing server"}, args("", f.echoPoll)...)
	if err != nil {
		return BreakdownRow{}, err
	}
	defer echo.Stop()
	addr := echo.Addrs["crossing server"]
	if f.hops == 2 {
		relay, err := StartChildEnv(ctx, exe, nil, []string{"crossing server"}, args(addr, f.relayPoll)...)
		if err != nil {
			return BreakdownRow{}, err
		}
		defer relay.Stop()
		addr = relay.Addrs["crossing server"]
	}
	lat, err := crossingRun(ctx, addr, n, f.client)
	if err != nil {
		return BreakdownRow{}, fmt.Errorf("%s: %w", f.name, err)
	}
	return BreakdownRow{System: f.name, What: f.what, Requests: len(lat), P50us: quantile(lat, 0.5), P90us: quantile(lat, 0.9)}, nil
}
