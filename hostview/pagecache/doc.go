// Package pagecache follows the kernel page cache of one mounted
// filesystem with eBPF, so the DPU agent's Host View covers the kernel's
// cache above the host's page store (FUSE files).
//
// Four classic tracepoints, filtered in the kernel to the mount's device,
// feed a ring buffer: mm_filemap_add_to_page_cache and
// mm_filemap_delete_from_page_cache (what the kernel holds), and
// mm_filemap_get_pages and mm_filemap_fault (what reads ask for, hits
// included). The loader checks each tracepoint's field layout in tracefs
// against the compiled program and refuses to attach on a mismatch.
// Classic tracepoints rather than tp_btf: their contexts carry inode,
// index and device already decoded, so the program needs no kernel
// structure layouts (no CO-RE, no vmlinux.h) and runs on kernels without
// BTF.
//
// The object is built by bpf2go (make generate, needs clang) and the
// outputs are committed, so building pd3 needs no C toolchain.
//
// A sink that is a Muter (View with Quiet set) mutes files: their inode
// goes into a map the programs look up after the device, and their events
// stop before the ring while the mount reads them ahead itself (no
// prefetcher wants their pages; a reader under a memory budget makes two
// events per page). The view forgets a muted file's pages; the tracker
// asks every 100 ms whether it wants them again.
//
// The programs wake the reader only once a quarter of the 4 MiB ring is
// waiting; the reader otherwise drains it every 2 ms (a wake-up per page
// cost a context switch on the read path). get_pages fires once per batch
// of pages a read hands out, each time to the end of the request; View
// keeps the first report and drops the suffixes.
//
// A get_pages event arrives after the kernel has queued the READs for the
// pages it names (readahead adds the pages, sends the READs, then the
// trace fires), so the agent uses read events to predict past the
// kernel's window, not to fetch the window itself.
package pagecache
