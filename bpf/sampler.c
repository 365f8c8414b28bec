// SPDX-License-Identifier: Apache-2.0
/*
 * Loader of the access sampler (sampler.bpf.c), run by the agent as a child
 * process.
 *
 * stdin takes one command a line:
 *   watch CGID THRESHOLD   start (or retune) sampling of a memory cgroup
 *   unwatch CGID           stop watching it
 *   counters               emit the counters of every watched cgroup
 *   sketches               emit every watched cgroup's distinct-page sketch
 *                          and start new ones (one per agent window)
 *   pause | resume         stop / restart draining the ring buffer
 *   quit                   detach and exit (so does EOF)
 *
 * stdout carries binary frames, a struct cp_frame header then its payload:
 *   CP_FRAME_RECORDS   struct cp_record[]
 *   CP_FRAME_COUNTERS  u64 monotonic ns, then struct cp_counter_entry[]
 *   CP_FRAME_MESSAGE   one line of text ("ready ...", "ok ...", "error ...")
 *   CP_FRAME_SKETCHES  struct cp_sketch_entry[]
 * Records are always flushed before a counters frame, so everything a
 * counters frame counts as sampled was sent ahead of it (or dropped).
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "cachepilot_hll.h"
#include "sampler.h"
#include "sampler.skel.h"

_Static_assert(sizeof(struct cp_sketch) == CP_HLL_REGS, "sketch size");

enum cp_frame_type {
	CP_FRAME_RECORDS = 1,
	CP_FRAME_COUNTERS = 2,
	CP_FRAME_MESSAGE = 3,
	CP_FRAME_SKETCHES = 4,
};

struct cp_frame {
	uint32_t type;
	uint32_t length;	/* payload bytes */
};

struct cp_counter_entry {
	uint64_t cgroup_id;
	uint64_t threshold;
	struct cp_counters c;
};

struct cp_sketch_entry {
	uint64_t cgroup_id;
	struct cp_sketch s;
};

#define OUT_RECORDS 2048	/* records batched per frame */
#define POLL_MS 50

static struct sampler_bpf *skel;
static struct ring_buffer *ring;
static struct cp_record out[OUT_RECORDS];
static size_t nout;
static int ncpus;
static int paused;
static uint64_t watched_ids[CP_MAX_WATCHED];	/* slot -> cgroup id, 0 = free */

static void write_all(const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = write(STDOUT_FILENO, p, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			/* the agent went away: nothing left to do */
			exit(0);
		}
		p += n;
		len -= n;
	}
}

static void send_frame(uint32_t type, const void *payload, uint32_t length)
{
	struct cp_frame f = { .type = type, .length = length };

	write_all(&f, sizeof(f));
	if (length)
		write_all(payload, length);
}

static void flush_records(void)
{
	if (!nout)
		return;
	send_frame(CP_FRAME_RECORDS, out, nout * sizeof(out[0]));
	nout = 0;
}

static void message(const char *fmt, ...)
{
	char line[512];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if (n >= (int)sizeof(line))
		n = sizeof(line) - 1;
	flush_records();
	send_frame(CP_FRAME_MESSAGE, line, n);
}

static int on_record(void *ctx, void *data, size_t size)
{
	if (size != sizeof(struct cp_record))
		return 0;
	memcpy(&out[nout++], data, sizeof(struct cp_record));
	if (nout == OUT_RECORDS)
		flush_records();
	return 0;
}

static int find_slot(uint64_t cgid)
{
	for (int i = 0; i < CP_MAX_WATCHED; i++)
		if (watched_ids[i] == cgid)
			return i;
	return -1;
}

static struct cp_watch index_entry(uint32_t i)
{
	struct cp_watch w = {};

	bpf_map__lookup_elem(skel->maps.watch_index, &i, sizeof(i), &w, sizeof(w), 0);
	return w;
}

static int set_index_entry(uint32_t i, const struct cp_watch *w)
{
	return bpf_map__update_elem(skel->maps.watch_index, &i, sizeof(i),
				    w, sizeof(*w), BPF_ANY);
}

/* Another watched id shares index entry i (it lives in the overflow map). */
static int index_shared(uint32_t i, uint64_t except)
{
	for (int s = 0; s < CP_MAX_WATCHED; s++)
		if (watched_ids[s] && watched_ids[s] != except &&
		    (watched_ids[s] & (CP_INDEX_SIZE - 1)) == i)
			return 1;
	return 0;
}

static int cmd_watch(uint64_t cgid, uint64_t threshold)
{
	uint32_t i = cgid & (CP_INDEX_SIZE - 1);
	struct cp_watch entry, w = { .cgroup_id = cgid, .threshold = threshold };
	struct cp_counters *zero;
	int slot = find_slot(cgid);
	int err;

	if (!cgid)
		return -EINVAL;
	if (slot < 0) {
		slot = find_slot(0);
		if (slot < 0)
			return -ENOSPC;
		/* a reused slot starts from zero */
		zero = calloc(ncpus, sizeof(*zero));
		if (!zero)
			return -ENOMEM;
		err = bpf_map__update_elem(skel->maps.counters, &slot, sizeof(slot),
					   zero, ncpus * sizeof(*zero), BPF_ANY);
		free(zero);
		if (err)
			return err;
		{
			static const struct cp_sketch empty;

			err = bpf_map__update_elem(skel->maps.sketches, &slot, sizeof(slot),
						   &empty, sizeof(empty), BPF_ANY);
			if (err)
				return err;
		}
		watched_ids[slot] = cgid;
	}
	w.slot = slot;
	entry = index_entry(i);
	if (!entry.cgroup_id || entry.cgroup_id == cgid) {
		w.flags = entry.flags;
		return set_index_entry(i, &w);
	}
	/* the index entry belongs to another cgroup: go to the overflow map */
	err = bpf_map__update_elem(skel->maps.watch_overflow, &cgid, sizeof(cgid),
				   &w, sizeof(w), BPF_ANY);
	if (err)
		return err;
	entry.flags |= CP_WATCH_COLLIDED;
	return set_index_entry(i, &entry);
}

static int cmd_unwatch(uint64_t cgid)
{
	uint32_t i = cgid & (CP_INDEX_SIZE - 1);
	int slot = find_slot(cgid);
	struct cp_watch entry;

	if (slot < 0)
		return -ENOENT;
	watched_ids[slot] = 0;
	entry = index_entry(i);
	if (entry.cgroup_id == cgid) {
		memset(&entry, 0, sizeof(entry));
		/* overflow entries of this index stay reachable */
		if (index_shared(i, cgid))
			entry.flags = CP_WATCH_COLLIDED;
		set_index_entry(i, &entry);
	} else {
		bpf_map__delete_elem(skel->maps.watch_overflow, &cgid, sizeof(cgid), 0);
	}
	return 0;
}

static int watch_threshold(uint64_t cgid, uint64_t *threshold)
{
	uint32_t i = cgid & (CP_INDEX_SIZE - 1);
	struct cp_watch w = index_entry(i);

	if (w.cgroup_id == cgid) {
		*threshold = w.threshold;
		return 0;
	}
	if (bpf_map__lookup_elem(skel->maps.watch_overflow, &cgid, sizeof(cgid),
				 &w, sizeof(w), 0))
		return -ENOENT;
	*threshold = w.threshold;
	return 0;
}

static int cmd_counters(void)
{
	static struct cp_counter_entry entries[CP_MAX_WATCHED];
	struct cp_counters *percpu;
	struct timespec ts;
	uint64_t now;
	size_t n = 0;
	char *buf;

	percpu = calloc(ncpus, sizeof(*percpu));
	if (!percpu)
		return -ENOMEM;
	/* records sampled so far must reach the agent before their counts */
	if (!paused)
		ring_buffer__consume(ring);
	for (int slot = 0; slot < CP_MAX_WATCHED; slot++) {
		struct cp_counter_entry *e;
		uint64_t cgid = watched_ids[slot];

		if (!cgid)
			continue;
		if (bpf_map__lookup_elem(skel->maps.counters, &slot, sizeof(slot),
					 percpu, ncpus * sizeof(*percpu), 0))
			continue;
		e = &entries[n++];
		memset(e, 0, sizeof(*e));
		e->cgroup_id = cgid;
		watch_threshold(cgid, &e->threshold);
		for (int cpu = 0; cpu < ncpus; cpu++) {
			uint64_t *dst = (uint64_t *)&e->c;
			uint64_t *src = (uint64_t *)&percpu[cpu];

			for (size_t k = 0; k < CP_NR_COUNTERS; k++)
				dst[k] += src[k];
		}
	}
	free(percpu);
	flush_records();
	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (uint64_t)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
	buf = malloc(sizeof(now) + n * sizeof(entries[0]));
	if (!buf)
		return -ENOMEM;
	memcpy(buf, &now, sizeof(now));
	memcpy(buf + sizeof(now), entries, n * sizeof(entries[0]));
	send_frame(CP_FRAME_COUNTERS, buf, sizeof(now) + n * sizeof(entries[0]));
	free(buf);
	return 0;
}

/*
 * Read and zero every watched cgroup's sketch.  A page read between the
 * two steps counts in neither window unless it is read again.
 */
static int cmd_sketches(void)
{
	static struct cp_sketch_entry entries[CP_MAX_WATCHED];
	static const struct cp_sketch zero;
	size_t n = 0;

	for (int slot = 0; slot < CP_MAX_WATCHED; slot++) {
		uint64_t cgid = watched_ids[slot];
		struct cp_sketch_entry *e;

		if (!cgid)
			continue;
		e = &entries[n];
		if (bpf_map__lookup_elem(skel->maps.sketches, &slot, sizeof(slot),
					 &e->s, sizeof(e->s), 0))
			continue;
		bpf_map__update_elem(skel->maps.sketches, &slot, sizeof(slot),
				     &zero, sizeof(zero), BPF_ANY);
		e->cgroup_id = cgid;
		n++;
	}
	send_frame(CP_FRAME_SKETCHES, entries, n * sizeof(entries[0]));
	return 0;
}

/*
 * Tell every CPU that its cached watch lookup is stale.  Called after the
 * maps changed: a CPU that read the old generation re-reads the maps.
 */
static void watch_maps_changed(void)
{
	__atomic_fetch_add(&skel->data->watch_gen, 1, __ATOMIC_SEQ_CST);
}

/* Returns 0 to go on, 1 to quit. */
static int handle_command(char *line)
{
	unsigned long long a, b;
	int err;

	line[strcspn(line, "\r\n")] = 0;
	if (!*line)
		return 0;
	if (sscanf(line, "watch %llu %llu", &a, &b) == 2) {
		err = cmd_watch(a, b);
		watch_maps_changed();
		if (err)
			message("error watch %llu: %s", a, strerror(-err));
		else
			message("ok watch %llu", a);
	} else if (sscanf(line, "unwatch %llu", &a) == 1) {
		err = cmd_unwatch(a);
		watch_maps_changed();
		if (err)
			message("error unwatch %llu: %s", a, strerror(-err));
		else
			message("ok unwatch %llu", a);
	} else if (!strcmp(line, "counters")) {
		err = cmd_counters();
		if (err)
			message("error counters: %s", strerror(-err));
	} else if (!strcmp(line, "sketches")) {
		err = cmd_sketches();
		if (err)
			message("error sketches: %s", strerror(-err));
	} else if (!strcmp(line, "pause")) {
		paused = 1;
		message("ok pause");
	} else if (!strcmp(line, "resume")) {
		paused = 0;
		message("ok resume");
	} else if (!strcmp(line, "quit")) {
		return 1;
	} else {
		message("error unknown command: %.100s", line);
	}
	return 0;
}

static int libbpf_quiet(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	if (level == LIBBPF_DEBUG)
		return 0;
	return vfprintf(stderr, fmt, ap);
}

static void usage(void)
{
	fprintf(stderr, "usage: sampler [--ring-bytes N] [--check] [--empty] [--copies N]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	unsigned long ring_bytes = 1UL << 22;
	char line[256];
	size_t have = 0;
	int check = 0;
	int empty = 0;
	int copies = 1;
	int err;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--ring-bytes") && i + 1 < argc)
			ring_bytes = strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--check"))
			check = 1;
		else if (!strcmp(argv[i], "--empty"))
			empty = 1;
		else if (!strcmp(argv[i], "--copies") && i + 1 < argc)
			copies = atoi(argv[++i]);
		else
			usage();
	}
	if (copies < 1 || copies > 64) {
		fprintf(stderr, "sampler: --copies must be 1..64\n");
		return 2;
	}
	/* a ring buffer is a power of two pages */
	if (ring_bytes < 4096 || (ring_bytes & (ring_bytes - 1))) {
		fprintf(stderr, "sampler: --ring-bytes must be a power of two >= 4096\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	libbpf_set_print(libbpf_quiet);

	ncpus = libbpf_num_possible_cpus();
	if (ncpus <= 0) {
		fprintf(stderr, "sampler: cannot count CPUs\n");
		return 1;
	}
	skel = sampler_bpf__open();
	if (!skel) {
		fprintf(stderr, "sampler: cannot open the BPF object: %s\n", strerror(errno));
		return 1;
	}
	bpf_map__set_max_entries(skel->maps.records, ring_bytes);
	if (empty) {
		/* the benchmark's floor: empty programs, nothing counted */
		bpf_program__set_autoload(skel->progs.on_get_pages, false);
		bpf_program__set_autoload(skel->progs.on_add_folio, false);
		bpf_program__set_autoload(skel->progs.on_delete_folio, false);
		bpf_program__set_autoload(skel->progs.empty_get_pages, true);
		bpf_program__set_autoload(skel->progs.empty_add_folio, true);
		bpf_program__set_autoload(skel->progs.empty_delete_folio, true);
	}
	err = sampler_bpf__load(skel);
	if (err) {
		fprintf(stderr, "sampler: cannot load the BPF programs: %s\n", strerror(-err));
		return 1;
	}
	err = sampler_bpf__attach(skel);
	if (err) {
		fprintf(stderr, "sampler: cannot attach to the filemap tracepoints: %s\n",
			strerror(-err));
		return 1;
	}
	/*
	 * Benchmarks only: the access program attached copies times, so that
	 * its per-read cost, tracepoint dispatch included, is multiplied
	 * above the noise of a shared host.  Every copy counts.
	 */
	for (int i = 1; i < copies; i++) {
		struct bpf_program *prog = empty ? skel->progs.empty_get_pages :
						   skel->progs.on_get_pages;

		if (libbpf_get_error(bpf_program__attach(prog))) {
			fprintf(stderr, "sampler: cannot attach copy %d\n", i);
			return 1;
		}
	}
	ring = ring_buffer__new(bpf_map__fd(skel->maps.records), on_record, NULL, NULL);
	if (!ring) {
		fprintf(stderr, "sampler: cannot open the ring buffer: %s\n", strerror(errno));
		return 1;
	}
	if (check) {
		printf("ok\n");
		return 0;
	}
	message("ready cpus=%d ring_bytes=%lu%s copies=%d", ncpus, ring_bytes,
		empty ? " empty" : "", copies);

	for (;;) {
		struct pollfd fds[2] = {
			{ .fd = STDIN_FILENO, .events = POLLIN },
			{ .fd = ring_buffer__epoll_fd(ring), .events = POLLIN },
		};
		int n = poll(fds, paused ? 1 : 2, POLL_MS);

		if (n < 0 && errno != EINTR)
			break;
		if (!paused)
			ring_buffer__consume(ring);
		flush_records();
		if (n > 0 && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
			ssize_t got = read(STDIN_FILENO, line + have, sizeof(line) - 1 - have);
			char *nl;

			if (got <= 0)
				break;
			have += got;
			line[have] = 0;
			while ((nl = strchr(line, '\n'))) {
				*nl = 0;
				if (handle_command(line))
					goto out;
				have -= nl + 1 - line;
				memmove(line, nl + 1, have + 1);
			}
			if (have == sizeof(line) - 1) {
				message("error command too long");
				have = 0;
			}
		}
	}
out:
	ring_buffer__free(ring);
	sampler_bpf__destroy(skel);
	return 0;
}
