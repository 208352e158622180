// Package fs is pd3's FUSE filesystem: files whose bytes live in remote
// memory, read and written through the host's page store, so that
// ordinary programs (cp, sqlite, fio, a build) run on disaggregated memory.
//
// A regular file of a page or less keeps its bytes in its inode, in the
// metadata (inline.go). A larger one is one sparse memory-node volume
// ("fs.NAME.vSEQ", made ahead of the files that take them, or
// "fs.NAME.INO", up to MaxFileSize); its pages are keyed like any volume's, so the DPU agent,
// Host View and the Loading Zone treat FUSE and NBD reads alike. The tree
// and attributes are a model in host memory kept in the volume
// "fs.NAME.meta" as a snapshot and a journal of what changed since: a
// record on fsync, every SyncInterval when changed, and at Close, each
// holding only what changed. A snapshot goes to the free one of two slots
// and a one-page header flips to it, so a crash leaves the previous
// snapshot and its journal whole; the syncer writes one when the journal
// outgrows twice the last, and loading replays records up to a torn tail.
// Volumes that the tree does not name (files created after the last save,
// volumes made ahead and not used, freed files' volumes not yet deleted
// in the background) are deleted at the next Open. Close leaves a clean
// mark; after a mount that crashed, each file's bytes past its saved size
// are zeroed before the run first reaches past it, and so are those a
// write that failed past the size may have left (stale.go).
//
// The volumes live behind a Backend: one memory node (*memnode.Client,
// which also holds the mount lease), or a replica.Group that keeps each
// of them at the same R nodes (the mount is then held in the control
// plane, Config.Fencing). Written tells what of a volume a copy of it
// must carry.
//
// The NBD volumes appear as files under volumes/, opened with direct I/O
// so the kernel page cache never hides a write made over NBD; both paths
// go through the same page store.
//
// A file read as a stream (READs of 256 KiB or more through one handle,
// each where the last ended) is read ahead by the mount into buffers of
// its own, which answer the next READs (readahead.go); the agent then
// leaves that file alone. So is a scan of smaller READs that each begin
// a little past where the last ended (a file the kernel caches in part
// sends those), read ahead by the page store into its windows.
//
// Directories are opened by the kernel itself (OPENDIR answers ENOSYS),
// which keeps their listings until it changes them; a listing's offsets
// are cookies of the names, so reading on after removals skips nothing
// (dirs.go).
//
// The kernel page cache sits above the page store for regular files. The
// hostview/pagecache tracker reports what it holds to the agent, which
// then never prefetches pages the kernel will not ask for.
package fs
