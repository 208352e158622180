// Package split runs the DPU agent as a process of its own (split mode):
// the host and the agent share a region of memory holding two rings and
// the Loading Zone, and the host fails over to its own memory-node
// connection whenever the agent's heartbeat stops.
//
//   - ringmsg.go is the region's layout and the ring messages (typed
//     header, byte layout, fuzzed); a reply carries the memory node's
//     status for the request.
//   - link.go is the host's side: Link attaches to a region, fails over,
//     resyncs Host View on attach, carries the host's calls and hints.
//   - splitagent.go is the agent's side: AgentRegion formats the region,
//     runs the dispatch loop and the workers that carry out host requests
//     through a dpu.Engine; the agent process's parts are wired by
//     host.RunAgent.
//
// The agent is an accelerator: a host whose agent died keeps serving.
package split
