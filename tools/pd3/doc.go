// Command pd3 runs pd3's pieces: a memory node (memnode), a host with its
// page, NBD and FUSE frontends (up, serve, mount), a separate DPU agent
// (dpu), clients (page), the page-cache viewer (cachestat) and the
// benchmarks (bench). `pd3 COMMAND --help` describes each; README.md says
// how they fit.
package main
