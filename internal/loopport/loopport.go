// Package loopport picks loopback TCP ports for servers that are started by
// port number (etcd, nbdkit) rather than handed a listener.
package loopport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// base is the lowest port drawn: above the registered services a test
// machine is likely to run.
const base = 10000

// Free returns n distinct loopback TCP ports, each free now. They are drawn
// below the kernel's ephemeral range, so that no outgoing connection (which
// takes its source port from that range) can occupy one between this call
// and the server's bind, and all n are held open together until every one
// is picked, so that two of them are never the same.
func Free(n int) ([]int, error) {
	low := ephemeralLow()
	var ports []int
	var held []net.Listener
	defer func() {
		for _, ln := range held {
			ln.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			return nil, fmt.Errorf("loopport: no free loopback port in %d..%d after %d tries", base, low-1, tries)
		}
		port := base + rand.IntN(low-base)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue // in use: draw again
		}
		held = append(held, ln)
		ports = append(ports, port)
	}
	return ports, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range, or
// Linux's default 32768 when it cannot be read or leaves too little below.
func ephemeralLow() int {
	const linuxDefault = 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return linuxDefault
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return linuxDefault
	}
	low, err := strconv.Atoi(f[0])
	if err != nil || low < base+1000 {
		return linuxDefault
	}
	return low
}
