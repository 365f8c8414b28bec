// SPDX-License-Identifier: GPL-2.0
/*
 * cachepilot access sampler.
 *
 * Three tp_btf programs on the filemap tracepoints count every page-cache
 * access, insertion and removal of each watched memory cgroup, and hand
 * the accesses and insertions whose page key hashes under the cgroup's
 * SHARDS threshold to user space through a ring buffer, each with the
 * thread that made it.
 *
 * A cgroup is named by its memcg's kernfs id, which is the inode number of
 * the cgroup directory in both cgroup v1 and v2; user space fills the
 * watch maps with those ids (see sampler.h).
 *
 * Every page-cache read runs the access program, so its common path makes
 * no helper call and no hash-map lookup: one per-CPU array entry (struct
 * cp_cpu, an inlined lookup) remembers the running task, the watch entry of
 * the last memcg and the id of the last file.  An event from a cgroup
 * nobody watches then costs that one lookup and a few loads.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "cachepilot_hash.h"
#include "cachepilot_hll.h"
#include "sampler.h"

char LICENSE[] SEC("license") = "GPL";

/* Longest access range sampled page by page; longer ranges are counted. */
#define CP_MAX_RANGE (1 << 20)
/* Ranges up to this many pages are sampled inline, longer ones in bpf_loop. */
#define CP_INLINE_RANGE 4
/* cp_cpu.slot of a memory cgroup nobody watches */
#define CP_SLOT_NONE 0xffffffffU
/* Slots of last_read (a power of two), chosen by thread id. */
#define CP_READ_SLOTS 4096

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CP_INDEX_SIZE);
	__type(key, __u32);
	__type(value, struct cp_watch);
} watch_index SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CP_MAX_WATCHED);
	__type(key, __u64);
	__type(value, struct cp_watch);
} watch_overflow SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CP_MAX_WATCHED);
	__type(key, __u32);
	__type(value, struct cp_counters);
} counters SEC(".maps");

/*
 * Per watched cgroup, a HyperLogLog sketch of every page it reads (not only
 * the sampled ones): how many distinct pages the window held, which the
 * "keys" SHARDS estimator sets against the sample's own key count.  It is
 * raised only while the cgroup is sampled (threshold > 0).  One copy for
 * all CPUs: a register only ever grows, and the only race, two CPUs
 * raising the same register at once with the smaller value stored last,
 * is rare and undone by the next read of the page that lost.  The loader
 * reads and zeroes the sketches once a window.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CP_MAX_WATCHED);
	__type(key, __u32);
	__type(value, struct cp_sketch);
} sketches SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);	/* resized by the loader before load */
} records SEC(".maps");

/*
 * Bumped by the loader after every change of the watch maps: a CPU's
 * cached lookup (struct cp_cpu) is only trusted while its generation is
 * the current one.  It starts at 1, so a zeroed cp_cpu never matches.
 */
volatile __u64 watch_gen = 1;

/*
 * What one CPU remembers between events.  A page-cache read costs little
 * more than the tracepoint's own dispatch only if it makes no helper call
 * (each one is a call and a return, ~20 ns on a host whose return thunks
 * mitigate SRSO: as much as the rest of the program) and does not redo work
 * the last event on this CPU already did: find the running task, its
 * memcg's watch entry, and hash the file's identity.  Tracepoint programs
 * run with preemption off, so nothing else uses the entry meanwhile.
 */
struct cp_cpu {
	__u64 current_task;	/* the task last seen running here; 0 = none */
	__u64 ctx_addr;		/* scratch: ctx's address as a number */
	/* the last memory cgroup seen here, and what the watch maps say of it */
	__u64 css_serial;	/* its css serial_nr (never reused); 0 = none */
	__u64 gen;		/* watch_gen when it was looked up */
	__u64 cgroup_id;
	__u64 threshold;
	__u32 slot;		/* counters slot, CP_SLOT_NONE when not watched */
	__u32 pad;
	/* the last file read here */
	__u64 dev;		/* its super_block's s_dev */
	__u64 ino;
	__u64 file_id;		/* 0 = not computed */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);	/* lookups are inlined */
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cp_cpu);
} cpu_state SEC(".maps");

/*
 * The last range a thread was seen reading, to tell a new read from the
 * rest of the same one.  mm_filemap_get_pages reports the whole range a
 * read still wants, [index, last], even when only its first folios were
 * found cached; the kernel then calls again for the remainder from the
 * first missing page (or past the 31 folios one call hands back), and that
 * call reports [later index, same last] again.  Counted as they come, the
 * pages after a gap would be accessed twice by one read, and a long read
 * over small folios many times.  A thread's next event with the same file,
 * the same last page and a first page inside the previous range, during
 * the same read system call (the thread's read-syscall count has not
 * moved), is that remainder and adds nothing.  (The kernel also has a path
 * that hands back a read's first folios without reporting them, when the
 * last one found is still under read-ahead I/O; those pages cannot be
 * seen here and go uncounted.)
 *
 * The slot is chosen by thread id and shared by threads whose ids collide;
 * an entry that is not the thread's own means a new read, which is what
 * every event was before.  An array lookup is inlined by the verifier.
 */
struct cp_read {
	__u64 task;		/* the thread's task_struct, as a number */
	__u64 syscr;		/* its read-syscall count at that event */
	__u64 mapping;
	__u64 index;
	__u64 last;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CP_READ_SLOTS);
	__type(key, __u32);
	__type(value, struct cp_read);
} last_read SEC(".maps");

/* verifier-inlined: no call at run time */
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym;

static __always_inline struct cp_cpu *this_cpu_state(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&cpu_state, &zero);
}

/*
 * The running task, without a helper call when this CPU's last answer still
 * holds.  The tracepoint's argument array (ctx) lives on the running task's
 * kernel stack, and stacks are THREAD_SIZE-aligned, so a remembered task is
 * the running one exactly when its stack is the one ctx lies in.  (A task's
 * stack pointer is cleared when its stack is freed, and two live tasks never
 * share one.)  When the check fails (another task, or ctx on an interrupt
 * stack) the helper answers and the answer is remembered.  x86-64 and arm64
 * stacks are at least 16 KiB; larger ones only make the check fail more.
 */
#define CP_STACK_ALIGN (16UL << 10)

static __always_inline struct task_struct *running_task(struct cp_cpu *cpu, void *ctx)
{
	struct task_struct *task;
	__u64 stack;

	/* a pointer stored and read back is a plain number */
	*(volatile __u64 *)&cpu->ctx_addr = (__u64)ctx;
	stack = *(volatile __u64 *)&cpu->ctx_addr & ~(CP_STACK_ALIGN - 1);
	if (cpu->current_task) {
		task = bpf_rdonly_cast((void *)cpu->current_task,
				       bpf_core_type_id_kernel(struct task_struct));
		if ((__u64)task->stack == stack)
			return task;
	}
	task = bpf_get_current_task_btf();
	cpu->current_task = (__u64)task;
	return task;
}

/* The memory cgroup's css of a task (v1 and v2 alike). */
static __always_inline struct cgroup_subsys_state *task_memcg_css(struct task_struct *task)
{
	int id = bpf_core_enum_value(enum cgroup_subsys_id, memory_cgrp_id);

	if (id < 0 || id >= CGROUP_SUBSYS_COUNT)
		return NULL;
	return task->cgroups->subsys[id];
}

/*
 * memcg_data's low bits are flags (below __NR_MEMCG_DATA_FLAGS); the rest is
 * a struct mem_cgroup *.  Older kernels without the enum use the same bits.
 */
static __always_inline unsigned long memcg_data_flags_mask(void)
{
	if (bpf_core_enum_value_exists(enum page_memcg_data_flags, __NR_MEMCG_DATA_FLAGS))
		return bpf_core_enum_value(enum page_memcg_data_flags, __NR_MEMCG_DATA_FLAGS) - 1;
	return 3UL;
}

/* The memory cgroup's css a folio is charged to (css is mem_cgroup's first member). */
static __always_inline struct cgroup_subsys_state *folio_memcg_css(struct folio *folio)
{
	unsigned long data = folio->memcg_data & ~memcg_data_flags_mask();
	struct mem_cgroup *memcg;

	if (!data)
		return NULL;
	memcg = bpf_rdonly_cast((void *)data, bpf_core_type_id_kernel(struct mem_cgroup));
	return &memcg->css;
}

static __always_inline __u32 folio_order_of(struct folio *folio)
{
	int head = bpf_core_enum_value(enum pageflags, PG_head);
	/* page flags are the first word of a folio in every layout */
	unsigned long flags = *(unsigned long *)folio;

	if (!(flags & (1UL << head)))
		return 0;
	return folio->_flags_1 & 0xff;
}

static __always_inline struct cp_watch *find_watch(__u64 cgid)
{
	__u32 i = cgid & (CP_INDEX_SIZE - 1);
	struct cp_watch *w = bpf_map_lookup_elem(&watch_index, &i);

	if (!w || !cgid)
		return NULL;
	if (w->cgroup_id == cgid)
		return w;
	if (!(w->flags & CP_WATCH_COLLIDED))
		return NULL;
	return bpf_map_lookup_elem(&watch_overflow, &cgid);
}

/*
 * The read system calls a task has made, or 0 on a kernel built without
 * task I/O accounting (CONFIG_TASK_XACCT), whose task_io_accounting has no
 * syscr.  The guard must name syscr itself: ioac exists either way, and a
 * read of a field the running kernel lacks fails CO-RE relocation and the
 * whole object with it.  Without the count, two reads of one range by the
 * same task that follow each other look like one split read.
 */
static __always_inline __u64 task_syscr(struct task_struct *task)
{
	if (!bpf_core_field_exists(task->ioac.syscr))
		return 0;
	/* a BTF pointer: a plain load, where BPF_CORE_READ would call a helper */
	return task->ioac.syscr;
}

/*
 * True if [index, last] is the remainder of the read this task's previous
 * event reported (see struct cp_read); remembers the event either way.
 */
static __always_inline bool rest_of_read(struct task_struct *task, struct address_space *mapping,
					 __u64 index, __u64 last)
{
	__u32 slot = task->pid & (CP_READ_SLOTS - 1);
	struct cp_read *r = bpf_map_lookup_elem(&last_read, &slot);
	__u64 syscr = task_syscr(task);
	bool rest;

	if (!r)
		return false;
	rest = r->task == (__u64)task && r->syscr == syscr &&
	       r->mapping == (__u64)mapping && r->last == last &&
	       index > r->index && index <= last;
	r->task = (__u64)task;
	r->syscr = syscr;
	r->mapping = (__u64)mapping;
	r->index = index;
	r->last = last;
	return rest;
}

/*
 * The counters of a memory cgroup if it is watched, else NULL.  The CPU's
 * cached answer for the same css and the same watch generation is reused;
 * otherwise the watch maps are read and the answer cached.
 */
static __always_inline struct cp_counters *watched(struct cp_cpu *cpu,
						   struct cgroup_subsys_state *css)
{
	struct cp_watch *w;
	__u64 serial, gen;
	__u32 slot;

	if (!css)
		return NULL;
	serial = css->serial_nr;
	/* read before the maps: a change after this read bumps it again */
	gen = watch_gen;
	if (serial != cpu->css_serial || gen != cpu->gen) {
		__u64 cgid = css->cgroup->kn->id;

		asm volatile("" ::: "memory");
		w = find_watch(cgid);
		cpu->css_serial = serial;
		cpu->gen = gen;
		cpu->cgroup_id = cgid;
		cpu->slot = w ? w->slot : CP_SLOT_NONE;
		cpu->threshold = w ? w->threshold : 0;
	}
	slot = cpu->slot;
	if (slot == CP_SLOT_NONE)
		return NULL;
	return bpf_map_lookup_elem(&counters, &slot);
}

/*
 * cp_page_key(dev, ino, index) == file id ^ index.  The id of the last file
 * is cached per CPU under the very (dev, ino) it is made of, so it can never
 * be stale; only its two hash rounds are saved.
 */
static __always_inline __u64 file_id_of(struct cp_cpu *cpu, struct address_space *mapping)
{
	struct inode *host = mapping->host;
	__u64 dev, ino;

	if (!host)
		return 0;
	dev = host->i_sb->s_dev;
	ino = host->i_ino;
	if (ino != cpu->ino || dev != cpu->dev || !cpu->file_id) {
		cpu->dev = dev;
		cpu->ino = ino;
		cpu->file_id = cp_hash64(cp_hash64(dev) ^ ino);
	}
	return cpu->file_id;
}

struct sample_ctx {
	__u64 file_id;
	__u64 first;
	__u64 threshold;
	__u64 cgroup_id;
	struct cp_counters *c;
	struct cp_sketch *sketch;	/* NULL: none for this slot */
};

/* Hand one sampled event (an access or an insert) to user space; 0 if
 * the ring buffer is full. */
static __always_inline int emit_record(__u64 key, __u64 cgroup_id, __u16 op)
{
	struct cp_record *r;

	r = bpf_ringbuf_reserve(&records, sizeof(*r), 0);
	if (!r)
		return 0;
	r->key = key;
	r->time_ns = bpf_ktime_get_ns();
	r->cgroup_id = cgroup_id;
	r->tid = (__u32)bpf_get_current_pid_tgid();
	r->op = op;
	r->folio_order = 0;
	/*
	 * Waking the reader for every record would cost more than the
	 * sampling itself; the loader polls on a short timeout and is only
	 * woken early, once the buffer is half full.
	 */
	if (bpf_ringbuf_query(&records, BPF_RB_AVAIL_DATA) >
	    bpf_ringbuf_query(&records, BPF_RB_RING_SIZE) / 2)
		bpf_ringbuf_submit(r, BPF_RB_FORCE_WAKEUP);
	else
		bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP);
	return 1;
}

static __always_inline void sample_page(struct sample_ctx *s, __u64 index)
{
	__u64 key = s->file_id ^ index;
	__u64 hash = cp_hash64(key);

	if (s->sketch)
		cp_hll_add(s->sketch->reg, hash, CP_HLL_BITS);
	if (hash >= s->threshold)		/* cp_sampled(), hash reused */
		return;
	if (emit_record(key, s->cgroup_id, CP_OP_ACCESS))
		s->c->sampled++;
	else
		s->c->drops++;
}

static long sample_page_cb(__u64 i, void *data)
{
	struct sample_ctx *s = data;

	sample_page(s, s->first + i);
	return 0;
}

SEC("tp_btf/mm_filemap_get_pages")
int BPF_PROG(on_get_pages, struct address_space *mapping, unsigned long index,
	     unsigned long last_index)
{
	struct cp_cpu *cpu = this_cpu_state();
	struct task_struct *task;
	struct cp_counters *c;
	struct sample_ctx s;
	__u64 n;

	if (!cpu)
		return 0;
	task = running_task(cpu, ctx);
	c = watched(cpu, task_memcg_css(task));
	if (!c || last_index < index)
		return 0;
	if (rest_of_read(task, mapping, index, last_index))
		return 0;
	n = last_index - index + 1;
	c->accesses += n;
	c->access_events++;
	if (!cpu->threshold)
		return 0;

	s.file_id = file_id_of(cpu, mapping);
	s.first = index;
	s.threshold = cpu->threshold;
	s.cgroup_id = cpu->cgroup_id;
	s.c = c;
	{
		__u32 slot = cpu->slot;

		s.sketch = bpf_map_lookup_elem(&sketches, &slot);	/* inlined */
	}
	if (n == 1) {
		/* the common case, a single page: no loop at all */
		sample_page(&s, index);
	} else if (n <= CP_INLINE_RANGE) {
		for (int i = 0; i < CP_INLINE_RANGE; i++) {
			if (i >= n)
				break;
			sample_page(&s, index + i);
		}
	} else {
		if (n > CP_MAX_RANGE)
			n = CP_MAX_RANGE;
		bpf_loop(n, sample_page_cb, &s, 0);
	}
	return 0;
}

/* One inserted page under the cgroup's threshold (the same key hash the
 * accesses are sampled by) goes to user space as an insert record, with
 * the thread that brought it in: the agent learns from these how often
 * the threads a tenant's throughput counts miss.  Counted apart from the
 * access records (`sampled`, which paces the sampling, and `drops`). */
static __always_inline void sample_insert(struct sample_ctx *s, __u64 index)
{
	__u64 key = s->file_id ^ index;

	if (cp_hash64(key) >= s->threshold)
		return;
	if (emit_record(key, s->cgroup_id, CP_OP_INSERT))
		s->c->sampled_inserts++;
	else
		s->c->insert_drops++;
}

static long sample_insert_cb(__u64 i, void *data)
{
	struct sample_ctx *s = data;

	sample_insert(s, s->first + i);
	return 0;
}

/* A folio of a watched cgroup entering (in) or leaving the page cache:
 * its pages and one event; an entering folio's sampled pages as records. */
static __always_inline void count_folio(struct folio *folio, bool in)
{
	struct cp_cpu *cpu = this_cpu_state();
	struct cp_counters *c;
	struct sample_ctx s;
	struct address_space *mapping;
	__u64 pages;

	if (!cpu)
		return;
	c = watched(cpu, folio_memcg_css(folio));
	if (!c)
		return;
	pages = 1ULL << folio_order_of(folio);
	if (!in) {
		c->removals += pages;
		c->removal_events++;
		return;
	}
	c->inserts += pages;
	c->insert_events++;
	mapping = folio->mapping;
	if (!cpu->threshold || !mapping)
		return;
	s.file_id = file_id_of(cpu, mapping);
	s.first = folio->index;
	s.threshold = cpu->threshold;
	s.cgroup_id = cpu->cgroup_id;
	s.c = c;
	s.sketch = NULL;	/* the sketch counts reads only */
	if (pages == 1)
		sample_insert(&s, s.first);
	else
		bpf_loop(pages, sample_insert_cb, &s, 0);
}

SEC("tp_btf/mm_filemap_add_to_page_cache")
int BPF_PROG(on_add_folio, struct folio *folio)
{
	count_folio(folio, true);
	return 0;
}

SEC("tp_btf/mm_filemap_delete_from_page_cache")
int BPF_PROG(on_delete_folio, struct folio *folio)
{
	count_folio(folio, false);
	return 0;
}

/*
 * Empty programs on the same tracepoints, loaded instead of the three above
 * by `sampler --empty`: the overhead benchmark's floor, i.e. what attaching
 * any tp_btf program at all costs (the tracepoint's dispatch into BPF).
 * The "?" keeps them from loading by default.
 */
SEC("?tp_btf/mm_filemap_get_pages")
int BPF_PROG(empty_get_pages)
{
	return 0;
}

SEC("?tp_btf/mm_filemap_add_to_page_cache")
int BPF_PROG(empty_add_folio)
{
	return 0;
}

SEC("?tp_btf/mm_filemap_delete_from_page_cache")
int BPF_PROG(empty_delete_folio)
{
	return 0;
}

