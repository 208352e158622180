// Package procgov runs a host with one P (GOMAXPROCS 1) while all it does
// is answer reads from memory one at a time, and with every P otherwise.
//
// On two shared vCPUs a cached NBD read at queue depth 1 took 43 µs at
// the median with two Ps and 17 µs with one (fio against pd3-local,
// docs/decisions.md, 23): with a second P, every request woke a second
// thread (the idle P's, in the network poller's epoll wait, which the
// connection's edges wake although nothing waits there), and the two
// threads and fio took turns on the two vCPUs. One P loses elsewhere: a
// miss needs the host's memory-node reader to run while the connection's
// reader sleeps in poll(2); several connections at one P each wait for
// the runtime's monitor to hand the P over (p99 of 30 ms at fio's Q8T8
// before the NBD server counted a hit as lone only on its only
// connection); deep queues need both cores.
//
// So the governor goes down to one P only after a run of lone hits
// (HitsBeforeLow), and back up at the first request of any other kind,
// before that request goes on. A host that comes back up soon after
// going low needs a run twice as long the next time (up to 65 536 hits),
// and one that stayed low for a while starts over. Each switch stops the
// world for microseconds; a host that mixes hits with misses never
// switches.
package procgov
