package packet

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pd3-go/pd3/dpu/mirror"
)

// Counters describe what a capture saw.
type Counters struct {
	Segments   atomic.Uint64 // TCP segments that passed the filter
	Bytes      atomic.Uint64 // payload bytes handed to streams
	Streams    atomic.Uint64 // connections followed from their SYN
	Unfollowed atomic.Uint64 // segments of connections seen mid-way
	Gaps       atomic.Uint64 // streams abandoned at a hole in the sequence
	Dropped    atomic.Uint64 // segments the kernel dropped for the socket
}

// Capture follows the connections to one TCP port.
type Capture struct {
	Counters
	port   uint16
	m      mirror.Mirror
	flows  map[flowKey]*flow
	buf    []byte
	f      *os.File
	rc     syscall.RawConn
	closed atomic.Bool
}

// MaxFlows bounds the connections followed at once; SYNs beyond it are
// not followed (a flood of them cannot grow the table without bound).
const MaxFlows = 1 << 16

type flowKey struct {
	src, dst [4]byte
	sport    uint16
}

type flow struct {
	s    mirror.Stream
	next uint32 // sequence number of the next byte the stream expects
}

// Listen opens a packet socket on the interface iface ("lo" for loopback)
// that sees the TCP segments sent to port. It needs CAP_NET_RAW.
func Listen(iface string, port uint16, m mirror.Mirror) (*Capture, error) {
	ifi, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, fmt.Errorf("packet mirror: %w", err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, int(htons(unix.ETH_P_IP)))
	if err != nil {
		return nil, fmt.Errorf("packet mirror: AF_PACKET socket (needs CAP_NET_RAW): %w", err)
	}
	c := &Capture{port: port, m: m, flows: map[flowKey]*flow{}, buf: make([]byte, 1<<16)}
	// Filter before binding so no unfiltered segment is queued meanwhile.
	prog := filter(port)
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("packet mirror: attaching the filter: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: ifi.Index}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("packet mirror: binding to %s: %w", iface, err)
	}
	// A bigger receive queue rides out the agent being descheduled.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
	// Non-blocking, so the runtime's poller waits for it and a wake-up
	// drains every queued segment (no thread parked in recvfrom).
	c.f = os.NewFile(uintptr(fd), "packet-mirror")
	rc, err := c.f.SyscallConn()
	if err != nil {
		c.f.Close()
		return nil, fmt.Errorf("packet mirror: %w", err)
	}
	c.rc = rc
	return c, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// filter keeps IPv4 TCP segments to port that the interface received
// (not the outgoing copies loopback also shows), unfragmented.
func filter(port uint16) []unix.SockFilter {
	const (
		skfAdOff     = -0x1000
		skfAdPkttype = 4
	)
	ins := func(code uint16, jt, jf uint8, k uint32) unix.SockFilter {
		return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
	}
	pkttype := int32(skfAdOff + skfAdPkttype)
	// Jump offsets count from the next instruction; 9 accepts, 10 drops.
	return []unix.SockFilter{
		ins(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, 0, 0, uint32(pkttype)), // 0: A = pkttype
		ins(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, 0, 8, unix.PACKET_HOST),
		ins(unix.BPF_LD|unix.BPF_B|unix.BPF_ABS, 0, 0, 9), // 2: protocol
		ins(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, 0, 6, unix.IPPROTO_TCP),
		ins(unix.BPF_LD|unix.BPF_H|unix.BPF_ABS, 0, 0, 6), // 4: flags | fragment offset
		ins(unix.BPF_JMP|unix.BPF_JSET|unix.BPF_K, 4, 0, 0x1fff),
		ins(unix.BPF_LDX|unix.BPF_B|unix.BPF_MSH, 0, 0, 0), // X = IP header length
		ins(unix.BPF_LD|unix.BPF_H|unix.BPF_IND, 0, 0, 2),  // TCP destination port
		ins(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, 0, 1, uint32(port)),
		ins(unix.BPF_RET|unix.BPF_K, 0, 0, 1<<18),
		ins(unix.BPF_RET|unix.BPF_K, 0, 0, 0),
	}
}

// Close stops Run, which then releases the socket and the open streams.
func (c *Capture) Close() error {
	if !c.closed.Swap(true) {
		c.f.SetReadDeadline(time.Unix(1, 0)) // wakes Run's wait
	}
	return nil
}

// Run reads segments until ctx is done or Close is called, then closes
// every stream it opened and the socket.
func (c *Capture) Run(ctx context.Context) error {
	defer func() {
		for k, f := range c.flows {
			f.s.Close()
			delete(c.flows, k)
		}
		c.stats()
		c.f.Close()
	}()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	var rerr error
	err := c.rc.Read(func(fd uintptr) bool {
		for !c.closed.Load() {
			n, _, err := unix.Recvfrom(int(fd), c.buf, 0)
			switch {
			case err == nil:
				c.Segment(c.buf[:n])
			case errors.Is(err, unix.EINTR):
			case errors.Is(err, unix.EAGAIN):
				return false // wait in the poller
			default:
				rerr = err
				return true
			}
		}
		return true
	})
	if c.closed.Load() {
		return nil
	}
	if rerr == nil {
		rerr = err
	}
	return fmt.Errorf("packet mirror: %w", rerr)
}

// stats adds the kernel's drop count since the last call.
func (c *Capture) stats() {
	c.rc.Control(func(fd uintptr) {
		st, err := unix.GetsockoptTpacketStats(int(fd), unix.SOL_PACKET, unix.PACKET_STATISTICS)
		if err == nil {
			c.Dropped.Add(uint64(st.Drops)) // reading resets the kernel's counters
		}
	})
}

const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
)

// Segment handles one IPv4 packet (exported for tests and fuzzing: it
// must survive any bytes).
func (c *Capture) Segment(p []byte) {
	if len(p) < 20 || p[0]>>4 != 4 {
		return
	}
	ihl := int(p[0]&0xf) * 4
	total := int(binary.BigEndian.Uint16(p[2:]))
	if ihl < 20 || total < ihl+20 || total > len(p) || p[9] != unix.IPPROTO_TCP {
		return
	}
	tcp := p[ihl:total]
	doff := int(tcp[12]>>4) * 4
	if doff < 20 || doff > len(tcp) || binary.BigEndian.Uint16(tcp[2:]) != c.port {
		return
	}
	c.Segments.Add(1)
	var k flowKey
	copy(k.src[:], p[12:16])
	copy(k.dst[:], p[16:20])
	k.sport = binary.BigEndian.Uint16(tcp[0:])
	seq := binary.BigEndian.Uint32(tcp[4:])
	flags := tcp[13]
	payload := tcp[doff:]
	f := c.flows[k]
	if flags&tcpSYN != 0 {
		if f != nil { // a new connection on a reused port
			f.s.Close()
			delete(c.flows, k)
		}
		if len(c.flows) >= MaxFlows {
			return
		}
		f = &flow{s: c.m.NewStream(), next: seq + 1}
		c.flows[k] = f
		c.Streams.Add(1)
		return
	}
	if f == nil {
		c.Unfollowed.Add(1)
		return
	}
	if len(payload) > 0 {
		// Serial-number arithmetic: d < 0 is a retransmission of bytes
		// already seen, d > 0 a hole the stream cannot cross.
		d := int64(int32(seq - f.next)) // int64: -MinInt32 must not overflow
		switch {
		case d > 0:
			c.Gaps.Add(1)
			f.s.Close()
			delete(c.flows, k)
			return
		case d < 0:
			if int(-d) >= len(payload) {
				payload = nil
			} else {
				payload = payload[-d:]
			}
		}
		if len(payload) > 0 {
			f.s.Observe(payload)
			f.next += uint32(len(payload))
			c.Bytes.Add(uint64(len(payload)))
		}
	}
	if flags&(tcpFIN|tcpRST) != 0 {
		f.s.Close()
		delete(c.flows, k)
	}
}

// ListenAddr is Listen on the interface that holds the IPv4 address of
// addr ("host:port", as a server listens on it).
func ListenAddr(addr string, m mirror.Mirror) (*Capture, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("packet mirror: %q is not an IP address and port: %w", addr, err)
	}
	ip := ap.Addr().Unmap()
	if !ip.Is4() || ip.IsUnspecified() {
		return nil, fmt.Errorf("packet mirror: %s: needs the server on one IPv4 address, not %v", addr, ip)
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("packet mirror: %w", err)
	}
	for _, ifi := range ifs {
		if ip.IsLoopback() && ifi.Flags&net.FlagLoopback != 0 {
			return Listen(ifi.Name, ap.Port(), m)
		}
		addrs, _ := ifi.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(net.IP(ip.AsSlice())) {
				return Listen(ifi.Name, ap.Port(), m)
			}
		}
	}
	return nil, fmt.Errorf("packet mirror: no interface holds %v", ip)
}
