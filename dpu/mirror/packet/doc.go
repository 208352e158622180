// Package packet is the off-path request mirror: it watches the TCP
// segments that clients send to a server port on an AF_PACKET socket and
// feeds each connection's bytes, reassembled in sequence order, to a
// mirror.Stream.
//
// It plays the part of the NIC that mirrors packets to a DPU in PD3: the
// agent sees a request when the kernel delivers the segment, before the
// host's reader has been scheduled to read its socket, and the host does
// no work for it at all (the tap, mirror.Conn, costs the host a ring copy
// and a doorbell per read). The server's path is untouched: a packet
// socket receives clones of the segments.
//
// A classic BPF filter in the kernel keeps only IPv4 TCP segments to the
// port that arrive at the host (on loopback every segment is seen twice,
// outgoing and incoming; only the incoming copy passes), so other traffic
// costs the capture nothing. A stream the capture cannot follow — it saw
// the connection start before the capture did, the socket dropped a
// segment, or a segment arrives past a hole — is closed and the rest of
// that connection is ignored: the agent misses prefetch chances, never
// sees invented bytes. Counters report each of these.
package packet
