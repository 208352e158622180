package bench

import (
	"bufio"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/internal/hist"
	"github.com/pd3-go/pd3/internal/netsrv"
	"github.com/pd3-go/pd3/internal/procstat"
	"github.com/pd3-go/pd3/internal/tlsfiles"
	"github.com/pd3-go/pd3/internal/units"
	"github.com/pd3-go/pd3/internal/workload"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
)

// TransportOptions configure the transport benchmark.
type TransportOptions struct {
	Exe      string        // the pd3 binary
	Duration time.Duration // per system
	Depth    int           // requests in flight
	Region   uint64        // bytes read from at random
	// Rounds runs the deep READ and stream systems this many times, taking
	// turns, and reports each one's median run (ratios of medians); the
	// Q1, FAA and TLS rows run once.
	Rounds int
}

type waiter interface{ Wait(context.Context) error }

// cpuMeter measures over one run the CPU of this process, a transport's
// client, and of the server child it reads from: with the rate it says
// which end a gap to a ceiling is spent at.
type cpuMeter struct {
	srv         *Child
	self, child time.Duration
}

func meterCPU(srv *Child) cpuMeter {
	self, _ := procstat.CPU(0)
	return cpuMeter{srv: srv, self: self, child: srv.CPU()}
}

// result is the Result of n pages moved in el, with the CPU per op.
func (m cpuMeter) result(sys, config string, n uint64, el time.Duration) Result {
	r := Result{System: sys, Config: config, Ops: n, OpsPerSec: float64(n) / el.Seconds(),
		GBytesPerSec: float64(n) * pageid.Size / el.Seconds() / 1e9}
	m.record(&r)
	return r
}

// record sets r's client ("host") and server ("memnode") CPU per op.
func (m cpuMeter) record(r *Result) {
	self, _ := procstat.CPU(0)
	if r.Ops > 0 {
		r.HostCPUusOp = us(self-m.self) / float64(r.Ops)
		r.MemnodeCPUusOp = us(m.srv.CPU()-m.child) / float64(r.Ops)
	}
}

// ring keeps depth requests in flight for d and returns how many completed.
func ring[C waiter](ctx context.Context, d time.Duration, depth int, issue func() C) (uint64, time.Duration, error) {
	calls := make([]C, depth)
	for i := range calls {
		calls[i] = issue()
	}
	var n uint64
	start := time.Now()
	deadline := start.Add(d)
	for i := 0; ; i = (i + 1) % depth {
		if err := calls[i].Wait(ctx); err != nil {
			return n, time.Since(start), err
		}
		n++
		if n%1024 == 0 && time.Now().After(deadline) {
			for j := 1; j < depth; j++ {
				calls[(i+j)%depth].Wait(ctx)
			}
			return n, time.Since(start), nil
		}
		calls[i] = issue()
	}
}

// fnRing keeps depth READs in flight for d as completion functions do
// (memnode.Client.ReadFn): each completion, on the connection's reader
// goroutine, issues the next READ into its buffer. It is the path of the
// host's misses and the agent's prefetches, and a client with no hand-off
// between a caller and the reader. It returns how many completed.
func fnRing(c *memnode.Client, vol uint16, pages uint64, d time.Duration, bufs [][]byte) (uint64, time.Duration, error) {
	var (
		n, out  atomic.Int64
		stop    atomic.Bool
		errOnce sync.Once
		first   error
		drained = make(chan struct{})
		// Completions run on the reader goroutine only, so one source
		// serves them all; the first READs take theirs before any runs.
		rng  = rand.New(rand.NewPCG(3, 4))
		offs = make([]uint64, len(bufs))
	)
	fns := make([]func(error), len(bufs))
	for i := range fns {
		offs[i] = rng.Uint64N(pages) * pageid.Size
		fns[i] = func(err error) {
			if err != nil {
				errOnce.Do(func() { first = err })
				stop.Store(true)
			} else {
				n.Add(1)
			}
			if stop.Load() {
				if out.Add(-1) == 0 {
					close(drained)
				}
				return
			}
			c.ReadFn(vol, rng.Uint64N(pages)*pageid.Size, bufs[i], fns[i])
		}
	}
	out.Store(int64(len(fns)))
	start := time.Now()
	for i := range fns {
		c.ReadFn(vol, offs[i], bufs[i], fns[i])
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-drained: // every READ failed
	}
	stop.Store(true)
	<-drained
	return uint64(n.Load()), time.Since(start), first
}

// Transport compares 4 KB READs through the memnode protocol with a raw TCP
// stream of the same bytes, the same READs over mutual TLS, and measures the
// 8-byte FAA rate.
func Transport(ctx context.Context, opt TransportOptions) (*Report, error) {
	if opt.Depth <= 0 {
		opt.Depth = 256
	}
	if opt.Region == 0 {
		opt.Region = 64 << 20
	}
	rep := &Report{Bench: "transport", Machine: Machine(), Ratios: map[string]float64{}}
	var plain []Result
	runs := map[string][]Result{}
	var byRound, byRoundFn []string // memnode(-fn)/rr-random-zc of each round
	for round := range max(opt.Rounds, 1) {
		// The ceiling runs between the node's two READ runs, which swap
		// places each round: each meets it at the same distance on
		// average, so a machine whose speed drifts within a round (this
		// VM's does, by up to 2x within a minute) biases neither ratio.
		var rr Result
		ceiling := func() error {
			var err error
			if rr, err = rrStream(ctx, opt); err != nil {
				return fmt.Errorf("random pages asked for and answered: %w", err)
			}
			return nil
		}
		rs, err := nodeReads(ctx, opt, "", round == 0, nodeRun{between: ceiling, fnFirst: round%2 == 1})
		if err != nil {
			return nil, err
		}
		if round == 0 {
			plain = rs
		}
		runs["memnode"] = append(runs["memnode"], rs[0])
		runs["memnode-fn"] = append(runs["memnode-fn"], rs[1])
		runs["rr-random-zc"] = append(runs["rr-random-zc"], rr)
		for _, sys := range []struct{ name, what string }{
			{"raw", "raw stream"},
			{"raw-random", "raw stream of random pages"},
			{"raw-random-zc", "raw stream of random pages, zero-copy"},
		} {
			r, err := rawStream(ctx, opt, sys.name)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", sys.what, err)
			}
			runs[sys.name] = append(runs[sys.name], r)
		}
		byRound = append(byRound, fmt.Sprintf("%.2f", rs[0].GBytesPerSec/rr.GBytesPerSec))
		byRoundFn = append(byRoundFn, fmt.Sprintf("%.2f", rs[1].GBytesPerSec/rr.GBytesPerSec))
	}
	mn, mnFn := medianRun(runs["memnode"]), medianRun(runs["memnode-fn"])
	raw, rawRandom := medianRun(runs["raw"]), medianRun(runs["raw-random"])
	rawZC, rr := medianRun(runs["raw-random-zc"]), medianRun(runs["rr-random-zc"])
	dir, err := os.MkdirTemp("", "pd3-bench-tls-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := tlsfiles.WriteCA(dir, dir); err != nil {
		return nil, err
	}
	mtls, err := nodeReads(ctx, opt, dir, true, nodeRun{})
	if err != nil {
		return nil, fmt.Errorf("over mutual TLS: %w", err)
	}

	crypto := sealOpen(opt.Duration / 2)
	rep.Results = append(append([]Result{mn, mnFn, raw, rawRandom, rawZC, rr}, plain[2:]...), append(mtls, crypto)...)
	rep.Ratios["memnode/raw"] = mn.GBytesPerSec / raw.GBytesPerSec
	rep.Ratios["memnode/raw-random"] = mn.GBytesPerSec / rawRandom.GBytesPerSec
	rep.Ratios["memnode/raw-random-zc"] = mn.GBytesPerSec / rawZC.GBytesPerSec
	// What memnode/raw can reach: a server of random pages that copies
	// each once (the kernel's copy into the socket) and does no protocol.
	rep.Ratios["raw-random-zc/raw"] = rawZC.GBytesPerSec / raw.GBytesPerSec
	// What memnode/raw can reach when, as with the memory node, every
	// page is asked for: the least request-and-answer exchange.
	rep.Ratios["rr-random-zc/raw"] = rr.GBytesPerSec / raw.GBytesPerSec
	rep.Ratios["memnode/rr-random-zc"] = mn.GBytesPerSec / rr.GBytesPerSec
	// The same client with no caller to hand each answer to: what a
	// session whose callers read the socket themselves could reach.
	rep.Ratios["memnode-fn/rr-random-zc"] = mnFn.GBytesPerSec / rr.GBytesPerSec
	rep.Ratios["memnode_rss/stored"] = float64(mn.MemnodeRSS) / float64(mn.MemnodeStored)
	// What the node holds of its own per byte stored: RSS also counts the
	// pages of its binary's text (tens of MiB with embedded etcd), which
	// are shared and reclaimable.
	rep.Ratios["memnode_private/stored"] = float64(mn.MemnodePrivate) / float64(mn.MemnodeStored)
	rep.Ratios["tls/plain"] = mtls[0].OpsPerSec / mn.OpsPerSec
	rep.Ratios["tls/plain_q1"] = mtls[1].OpsPerSec / plain[2].OpsPerSec
	// The ceiling: the plain run's CPU per READ plus one seal and one open
	// of its 4 KiB, spread over the machine's cores as the plain run was.
	cores := float64(runtime.NumCPU())
	ceiling := 1 / (1/mn.OpsPerSec + 1/crypto.OpsPerSec/cores)
	rep.Ratios["tls/plain_ceiling"] = ceiling / mn.OpsPerSec
	rep.Notes = append(rep.Notes,
		fmt.Sprintf("one connection, %d requests in flight, %v per system; raw = 4 KiB blocks streamed over one TCP connection by a separate process from one cache-hot buffer; raw-random = the same stream, each block copied from a random page of a %s region first (the memory node's copy); raw-random-zc = blocks written straight from random pages of that region, 64 per writev (one copy, the kernel's: the ceiling of any server of random pages); rr-random-zc = those pages asked for one by one, %d requests of 32 bytes in flight, each answered by a 16-byte header and the page (one goroutine at each end, no protocol: the ceiling of any server that is asked for every page)", opt.Depth, opt.Duration, units.FormatSize(opt.Region), opt.Depth),
		"memnode 4KiB READ = one caller keeping the READs in flight, waiting for each in turn (Wait); 4KiB READ fn = the same READs issued by completion functions on the client's reader goroutine (ReadFn, as the host's misses and the agent's prefetches go), no caller to wake",
		"host CPU = this process, the client; memnode CPU = the server process (memory node or raw server); both per op over the run",
		"memnode-mtls = the same node and client over mutual TLS (ECDSA P-256 certificates of a throwaway CA, the TLS version and cipher Go negotiates); Q1 = one request at a time, latency per request",
		"aes-gcm = one goroutine sealing and opening 4 KiB with AES-128-GCM (what TLS 1.3 adds per READ); tls/plain_ceiling = the plain READ rate with that work added, spread over all cores",
	)
	if len(byRound) > 1 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("4KiB READ and stream rows: each system's median of %d runs by throughput, the systems taking turns, rr-random-zc between the memory node's two READ runs, which swap places each round (ratios of medians); memnode/rr-random-zc by round: %s; memnode-fn/rr-random-zc: %s", len(byRound), strings.Join(byRound, " "), strings.Join(byRoundFn, " ")))
	}
	return rep, nil
}

// nodeRun places another system's run among nodeReads' own (in clear).
type nodeRun struct {
	// between, if set, runs between the READs that wait and those with
	// completion functions.
	between func() error
	// fnFirst runs the READs with completion functions first.
	fnFirst bool
}

// nodeReads starts a memory node (over mutual TLS with the certificates in
// tlsDir, laid out by tlsfiles.WriteCA, when it is not "") and measures
// 4 KiB READs at opt.Depth: READs that wait and, in clear, READs with
// completion functions, run as place says and reported in that order
// whatever it says; then, if full, READs one at a time and, in clear
// only, 8-byte FAAs.
func nodeReads(ctx context.Context, opt TransportOptions, tlsDir string, full bool, place nodeRun) ([]Result, error) {
	sys := "memnode"
	args := []string{"memnode", "--listen", "127.0.0.1:0"}
	var copt memnode.ClientOptions
	if tlsDir != "" {
		sys = "memnode-mtls"
		srv := tlsfiles.ServerFiles(tlsDir)
		args = append(args, "--tls-ca", srv.CA, "--tls-cert", srv.Cert, "--tls-key", srv.Key)
		var err error
		if copt.TLS, err = tlsfiles.ClientFiles(tlsDir).Client(); err != nil {
			return nil, err
		}
	}
	node, err := StartChild(ctx, opt.Exe, []string{"memory node"}, args...)
	if err != nil {
		return nil, err
	}
	defer node.Stop()
	c, err := memnode.Dial(ctx, node.Addrs["memory node"], copt)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	vol, err := c.Create(ctx, "transport", opt.Region)
	if err != nil {
		return nil, err
	}
	if err := Populate(ctx, c, vol); err != nil {
		return nil, err
	}
	pages := opt.Region / pageid.Size
	rng := rand.New(rand.NewPCG(1, 2))
	bufs := make([][]byte, opt.Depth)
	for i := range bufs {
		bufs[i] = make([]byte, pageid.Size)
	}
	var deep, fn Result
	waits := func() error {
		slot := 0
		cpu := meterCPU(node)
		n, el, err := ring(ctx, opt.Duration, opt.Depth, func() memnode.Call {
			slot = (slot + 1) % len(bufs)
			return c.ReadAsync(ctx, vol.ID, rng.Uint64N(pages)*pageid.Size, bufs[slot])
		})
		if err != nil {
			return fmt.Errorf("%s reads: %w", sys, err)
		}
		hostRSS, _ := procstat.RSS(0)
		deep = Result{System: sys, Config: "4KiB READ", Ops: n, OpsPerSec: float64(n) / el.Seconds(),
			GBytesPerSec: float64(n) * pageid.Size / el.Seconds() / 1e9,
			MemnodeRSS:   node.RSS(), MemnodeStored: vol.Size, MemnodePrivate: node.Private(), HostRSS: hostRSS}
		cpu.record(&deep)
		return nil
	}
	fns := func() error {
		cpu := meterCPU(node)
		n, el, err := fnRing(c, vol.ID, pages, opt.Duration, bufs)
		if err != nil {
			return fmt.Errorf("%s reads with completion functions: %w", sys, err)
		}
		fn = Result{System: sys, Config: "4KiB READ fn", Ops: n, OpsPerSec: float64(n) / el.Seconds(),
			GBytesPerSec: float64(n) * pageid.Size / el.Seconds() / 1e9}
		cpu.record(&fn)
		return nil
	}
	order := []func() error{waits}
	if tlsDir == "" {
		order = append(order, place.between, fns)
		if place.fnFirst {
			order[0], order[2] = fns, waits
		}
	}
	for _, run := range order {
		if run == nil {
			continue
		}
		if err := run(); err != nil {
			return nil, err
		}
	}
	rs := []Result{deep}
	if tlsDir == "" {
		rs = append(rs, fn)
	}
	if !full {
		return rs, nil
	}

	var lat hist.H
	start := time.Now()
	for time.Since(start) < opt.Duration/2 {
		t0 := time.Now()
		if err := c.ReadAt(ctx, vol.ID, rng.Uint64N(pages)*pageid.Size, bufs[0]); err != nil {
			return nil, fmt.Errorf("%s reads at Q1: %w", sys, err)
		}
		lat.Record(time.Since(t0))
	}
	q1 := Result{System: sys, Config: "4KiB READ Q1", Ops: lat.Count(), OpsPerSec: float64(lat.Count()) / time.Since(start).Seconds(),
		P50us: us(lat.Quantile(0.5)), P99us: us(lat.Quantile(0.99))}
	if tlsDir != "" {
		return append(rs, q1), nil
	}

	n, el, err := ring(ctx, opt.Duration, opt.Depth, func() memnode.Call {
		return c.FetchAndAddAsync(ctx, vol.ID, rng.Uint64N(opt.Region/8)*8, 1)
	})
	if err != nil {
		return nil, fmt.Errorf("memnode FAA: %w", err)
	}
	faa := Result{System: sys, Config: "8B FAA", Ops: n, OpsPerSec: float64(n) / el.Seconds()}
	return append(rs, q1, faa), nil
}

// sealOpen measures AES-128-GCM sealing then opening 4 KiB on one
// goroutine for d: the TLS record work a READ's payload costs its two ends.
func sealOpen(d time.Duration) Result {
	block, _ := aes.NewCipher(make([]byte, 16))
	aead, _ := cipher.NewGCM(block)
	nonce := make([]byte, aead.NonceSize())
	page := make([]byte, pageid.Size)
	sealed := make([]byte, 0, len(page)+aead.Overhead())
	var n uint64
	start := time.Now()
	for ; n%64 != 0 || time.Since(start) < d; n++ {
		sealed = aead.Seal(sealed[:0], nonce, page, nil)
		if _, err := aead.Open(page[:0], nonce, sealed, nil); err != nil {
			panic(err) // its own ciphertext: cannot fail
		}
	}
	return Result{System: "aes-gcm", Config: "seal+open 4KiB", Ops: n, OpsPerSec: float64(n) / time.Since(start).Seconds(),
		GBytesPerSec: float64(n) * pageid.Size / time.Since(start).Seconds() / 1e9}
}

// rawStream measures the raw stream of system sys: "raw", "raw-random"
// or "raw-random-zc" (ServeRaw).
func rawStream(ctx context.Context, opt TransportOptions, sys string) (Result, error) {
	var args []string
	if sys != "raw" {
		args = append(args, "--random-region", strconv.FormatUint(opt.Region, 10))
	}
	if sys == "raw-random-zc" {
		args = append(args, "--zero-copy")
	}
	srv, nc, err := rawServer(ctx, opt, args...)
	if err != nil {
		return Result{}, err
	}
	defer srv.Stop()
	defer nc.Close()
	r := bufio.NewReaderSize(nc, 256<<10)
	buf := make([]byte, pageid.Size)
	var n uint64
	cpu := meterCPU(srv)
	start := time.Now()
	deadline := start.Add(opt.Duration)
	for {
		if _, err := io.ReadFull(r, buf); err != nil {
			return Result{}, err
		}
		n++
		if n%1024 == 0 && time.Now().After(deadline) {
			break
		}
	}
	return cpu.result(sys, "4KiB stream", n, time.Since(start)), nil
}

// rawServer starts a raw server (ServeRaw) with args and connects to it.
func rawServer(ctx context.Context, opt TransportOptions, args ...string) (*Child, net.Conn, error) {
	srv, err := StartChild(ctx, opt.Exe, []string{"raw server"}, append([]string{"bench", "raw-server", "--listen", "127.0.0.1:0"}, args...)...)
	if err != nil {
		return nil, nil, err
	}
	nc, err := net.Dial("tcp", srv.Addrs["raw server"])
	if err != nil {
		srv.Stop()
		return nil, nil, err
	}
	return srv, nc, nil
}

// rrStream measures rr-random-zc: opt.Depth fixed requests in flight on
// one connection to ServeRaw in answer mode, each answered by a header and
// a random page, with nothing between the socket and the loop but one
// goroutine: it writes as many new requests as answers it took from each
// read, and copies each answer's page out as a client must. It is the
// ceiling of any request-and-answer server of random pages on this
// machine: the memory node's work without its tags, calls, table,
// windows or goroutines.
func rrStream(ctx context.Context, opt TransportOptions) (Result, error) {
	srv, nc, err := rawServer(ctx, opt, "--random-region", strconv.FormatUint(opt.Region, 10), "--zero-copy", "--answer")
	if err != nil {
		return Result{}, err
	}
	defer srv.Stop()
	defer nc.Close()
	pages := opt.Region / pageid.Size
	rng := rand.New(rand.NewPCG(1, 2))
	reqs := make([]byte, opt.Depth*rrRequest)
	ask := func(k int) error {
		for i := range k {
			r := reqs[i*rrRequest : (i+1)*rrRequest]
			binary.LittleEndian.PutUint64(r[16:], rng.Uint64N(pages)*pageid.Size)
		}
		_, err := nc.Write(reqs[:k*rrRequest])
		return err
	}
	if err := ask(opt.Depth); err != nil {
		return Result{}, err
	}
	in := make([]byte, 256<<10)
	// Each page goes to the buffer of its request, one per request in
	// flight, as the memory node's bench reads into its callers' buffers:
	// a copy into one cache-hot page cost a quarter of what those copies
	// cost, and a client cannot choose where its callers want their pages.
	dst := make([][]byte, opt.Depth)
	for i := range dst {
		dst[i] = make([]byte, pageid.Size)
	}
	slot := 0
	var n uint64
	have := 0
	cpu := meterCPU(srv)
	start := time.Now()
	deadline := start.Add(opt.Duration)
	for {
		m, err := nc.Read(in[have:])
		if err != nil {
			return Result{}, err
		}
		have += m
		k := have / rrAnswer
		for i := range k {
			copy(dst[slot], in[i*rrAnswer+rrHeader:(i+1)*rrAnswer])
			slot = (slot + 1) % len(dst)
		}
		have = copy(in, in[k*rrAnswer:have])
		n += uint64(k)
		if n >= 1024 && time.Now().After(deadline) {
			break
		}
		if err := ask(k); err != nil {
			return Result{}, err
		}
	}
	return cpu.result("rr-random-zc", "4KiB ask+answer", n, time.Since(start)), nil
}

// The request-and-answer ceiling's frames are a memory node's sizes: a
// 32-byte request carrying the page's offset where a READ does (bytes
// 16..24), a 16-byte answer header, then the page.
const (
	rrRequest = 32
	rrHeader  = 16
	rrAnswer  = rrHeader + pageid.Size
)

// answerRequests is ServeRaw's answer mode on one connection: it reads
// the requests that arrived (one read(2) per burst) and answers them in
// order, 64 to a writev, each page written straight from mem. There is no
// protocol beyond the frame sizes: this is the least a server that is
// asked for each page must do.
func answerRequests(nc net.Conn, mem []byte) {
	const batch = 64
	in := make([]byte, 64<<10)
	heads := make([]byte, batch*rrHeader)
	iov := make([][]byte, 0, 2*batch)
	have := 0
	for {
		m, err := nc.Read(in[have:])
		if err != nil {
			return
		}
		have += m
		k := have / rrRequest
		for first := 0; first < k; first += batch {
			iov = iov[:0]
			for i := first; i < min(k, first+batch); i++ {
				o := binary.LittleEndian.Uint64(in[i*rrRequest+16:]) % uint64(len(mem)) &^ (pageid.Size - 1)
				h := heads[(i-first)*rrHeader : (i-first+1)*rrHeader]
				copy(h[8:], in[i*rrRequest+8:i*rrRequest+16]) // the tag, echoed
				iov = append(iov, h, mem[o:o+pageid.Size])
			}
			v := net.Buffers(iov)
			if _, err := v.WriteTo(nc); err != nil {
				return
			}
		}
		have = copy(in, in[k*rrRequest:have])
	}
}

// ServeRaw streams 4 KiB blocks to every connection on ln, batched into
// 256 KiB writes like the memory node's responses, until ctx ends. With
// region > 0 each block is first copied from a random page of a region of
// that many bytes, as the memory node copies pages into its responses;
// with zeroCopy too, the blocks are written straight from those pages
// (one writev of 64 of them), so the kernel's copy into the socket is the
// only one: the ceiling of any server of random pages.
//
// With answer (and region > 0) it streams nothing of its own: it answers
// requests instead (answerRequests), the ceiling rrStream measures.
func ServeRaw(ctx context.Context, ln net.Listener, region uint64, zeroCopy, answer bool) error {
	var mem []byte
	if region > 0 {
		mem = make([]byte, region)
		for i := 0; i < len(mem); i += pageid.Size {
			workload.FillPage(pageid.Key(i/pageid.Size), mem[i:i+pageid.Size])
		}
	}
	var g netsrv.Group
	defer g.Close()
	return g.Serve(ctx, ln, func(nc net.Conn) {
		buf := make([]byte, 256<<10)
		for i := 0; i < len(buf); i += pageid.Size {
			workload.FillPage(pageid.Key(i/pageid.Size), buf[i:i+pageid.Size])
		}
		if answer && mem != nil {
			answerRequests(nc, mem)
			return
		}
		rng := rand.New(rand.NewPCG(3, 4))
		var iov [256 << 10 / pageid.Size][]byte
		for zeroCopy && mem != nil {
			for i := range iov {
				o := rng.Uint64N(region/pageid.Size) * pageid.Size
				iov[i] = mem[o : o+pageid.Size]
			}
			v := net.Buffers(iov[:])
			if _, err := v.WriteTo(nc); err != nil {
				return
			}
		}
		for {
			if mem != nil {
				for i := 0; i < len(buf); i += pageid.Size {
					o := rng.Uint64N(region/pageid.Size) * pageid.Size
					copy(buf[i:i+pageid.Size], mem[o:o+pageid.Size])
				}
			}
			if _, err := nc.Write(buf); err != nil {
				return
			}
		}
	})
}
