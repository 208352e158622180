// Package dpu is the DPU agent of PD3: it reads the host's incoming
// requests before the host serves them, asks Host View which of their pages
// the host will miss, and prefetches those from the memory node into the
// host's Loading Zone.
//
//   - Parsers (package parse) turn request streams into page accesses:
//     PageParser for the page protocol, NBDParser for NBD. The streams
//     come from the host's connection readers (mirror.Conn, the tap) or
//     from an AF_PACKET capture of the server's port (mirror/packet). The FUSE
//     frontend and the kernel page-cache tracker report ranges directly
//     (Agent.ReadAhead), which feed Sequential, a per-stream predictor.
//   - Agent batches accesses, checks Host View (and, for FUSE files, the
//     kernel's), and hands misses to the Engine; host evictions remove keys
//     from Host View.
//   - Engine is the transfer engine: one Conn (a memory-node connection,
//     or the replicas of replicated volumes) carrying the host's reads and
//     write-backs and the agent's prefetches, ordered by PD3's Table 2 so
//     that a prefetched copy never predates a write-back of its page.
//   - Leap is the host-side baseline prefetcher (majority delta over the
//     host's own misses).
//   - In split mode the agent is its own process behind shared-memory
//     rings and a shared Loading Zone (package split: the host's Link and
//     the agent's AgentRegion); the host fails over to its own connection
//     whenever the agent's heartbeat stops.
//
// The agent is an accelerator: the host never needs it to be correct.
package dpu
