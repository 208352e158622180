// SPDX-License-Identifier: (MIT OR GPL-2.0)
//go:build ignore

// Page-cache events of one filesystem (one s_dev), from the kernel's
// filemap tracepoints, sent to user space through a ring buffer. Contexts
// are the classic tracepoint layouts; the Go loader checks them against
// tracefs before attaching, so a kernel with another layout turns the
// tracker off instead of feeding it garbage.

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual MIT/GPL";

enum kind { KIND_ADD = 1, KIND_DELETE = 2, KIND_ACCESS = 3 };

// The reader is woken once this much is waiting (a quarter of the ring),
#define WAKEUP_BYTES (1 << 20)
// and when an event lands in a ring holding no more than this (8 records
// of 32 bytes and their 8-byte headers): the reader found the ring empty
// and sleeps until then. Eight, not one, so that events racing on other
// CPUs, each seeing the others' reservations, still wake it.
#define IDLE_BYTES (8 * 40)

struct event {
	__u64 ino;
	__u64 first;
	__u64 last;
	__u32 kind;
	__u32 pad;
};

// The mount's device as the kernel encodes it (MAJOR << 20 | MINOR),
// set by the loader.
volatile const __u32 target_dev = 0;

// Keeps struct event in the BTF for bpf2go.
const struct event *unused_event __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);
} events SEC(".maps");

// Files whose events nobody wants for now (the host reads them ahead
// itself), by inode number, set from user space: their events stop here,
// before the ring (docs/decisions.md, 37).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, __u8);
} muted SEC(".maps");

// With follow_chosen set by the loader, only the files in followed (by
// inode number, set from user space) are traced: a mount's small files,
// which no prefetcher has anything to do for, then cost one lookup here
// per event, not a record in the ring (docs/decisions.md, 44).
volatile const __u32 follow_chosen = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 16);
	__type(key, __u64);
	__type(value, __u8);
} followed SEC(".maps");

// counters[0] counts events dropped because the ring was full,
// counters[1] events submitted (so user space can wait for all of them).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline void count(__u32 i)
{
	__u64 *n = bpf_map_lookup_elem(&counters, &i);
	if (n)
		(*n)++;
}

struct page_ctx { // mm_filemap_add_to_page_cache, mm_filemap_delete_from_page_cache
	__u64 common;
	__u64 pfn;
	__u64 i_ino;
	__u64 index;
	__u32 s_dev;
	__u8 order;
};

struct range_ctx { // mm_filemap_get_pages, mm_filemap_fault (no last_index)
	__u64 common;
	__u64 i_ino;
	__u32 s_dev;
	__u32 pad;
	__u64 index;
	__u64 last_index;
};

// wanted reports whether an event of inode ino on device s_dev goes to
// user space.
static __always_inline int wanted(__u32 s_dev, __u64 ino)
{
	if (s_dev != target_dev)
		return 0;
	if (follow_chosen && !bpf_map_lookup_elem(&followed, &ino))
		return 0;
	return !bpf_map_lookup_elem(&muted, &ino);
}

static __always_inline int emit(__u32 kind, __u64 ino, __u64 first, __u64 last)
{
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(0);
		return 0;
	}
	e->ino = ino;
	e->first = first;
	e->last = last;
	e->kind = kind;
	e->pad = 0;
	count(1);
	// Waking the reader per event cost a context switch per page on the
	// read path: while events flow, user space drains on a timer and is
	// woken only when the ring fills up; an idle reader sleeps until the
	// first event into the emptied ring.
	__u64 avail = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	__u64 flags = avail <= IDLE_BYTES || avail >= WAKEUP_BYTES ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
	bpf_ringbuf_submit(e, flags);
	return 0;
}

SEC("tracepoint/filemap/mm_filemap_add_to_page_cache")
int page_added(struct page_ctx *ctx)
{
	if (!wanted(ctx->s_dev, ctx->i_ino))
		return 0;
	return emit(KIND_ADD, ctx->i_ino, ctx->index, ctx->index + (1ULL << (ctx->order & 31)) - 1);
}

SEC("tracepoint/filemap/mm_filemap_delete_from_page_cache")
int page_deleted(struct page_ctx *ctx)
{
	if (!wanted(ctx->s_dev, ctx->i_ino))
		return 0;
	return emit(KIND_DELETE, ctx->i_ino, ctx->index, ctx->index + (1ULL << (ctx->order & 31)) - 1);
}

SEC("tracepoint/filemap/mm_filemap_get_pages")
int pages_read(struct range_ctx *ctx)
{
	if (!wanted(ctx->s_dev, ctx->i_ino))
		return 0;
	return emit(KIND_ACCESS, ctx->i_ino, ctx->index, ctx->last_index);
}

SEC("tracepoint/filemap/mm_filemap_fault")
int page_fault(struct range_ctx *ctx)
{
	if (!wanted(ctx->s_dev, ctx->i_ino))
		return 0;
	return emit(KIND_ACCESS, ctx->i_ino, ctx->index, ctx->index);
}
