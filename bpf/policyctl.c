// SPDX-License-Identifier: Apache-2.0
/*
 * policyctl: attaches, swaps and detaches the cache_ext policy of one memory
 * cgroup, for the agent (agent/cache_ext.py) and for operators.
 *
 *   policyctl [OPTIONS] attach CGROUP POLICY [MAP=TID,TID...]...
 *   policyctl [OPTIONS] swap   CGROUP POLICY [MAP=TID,TID...]...
 *   policyctl [OPTIONS] detach CGROUP
 *   policyctl [OPTIONS] tids   CGROUP MAP [TID...]
 *   policyctl [OPTIONS] drop   CGROUP_ID
 *   policyctl [OPTIONS] list
 *   policyctl [OPTIONS] stats  CGROUP
 *
 *   --policy-dir DIR   where POLICY.bpf.o is looked for (default: policies/
 *                      beside this program); POLICY is a bare name, never a
 *                      path, so nothing outside DIR can be loaded
 *   --pin-root DIR     bpffs folder of the pins (/sys/fs/bpf/cachepilot)
 *   --root DIR         refuse cgroups outside DIR (repeatable)
 *   --capacity PAGES   size the policy for this many pages instead of the
 *                      cgroup's memory limit
 *
 * A policy is attached with a struct_ops link whose target is the cgroup
 * and the link is pinned at PIN_ROOT/<cgroup id>/link, so the policy stays
 * when this program (or the agent) exits.  Its thread-id maps (the
 * application-informed policies' *tids maps) are pinned beside it as
 * PIN_ROOT/<cgroup id>/<map>, where `tids` replaces their contents.  `swap`
 * loads the new policy and replaces the old one behind the same link
 * (BPF_LINK_UPDATE); the kernel keeps the cgroup under the old policy if
 * the new one fails to start.  `detach` detaches the link and removes the
 * pins; `drop` removes the pins of a cgroup that no longer exists (the
 * kernel detached its policy when the cgroup went).  `list` prints one
 * line per pinned cgroup: its id and the name of its link's struct_ops map.
 *
 * Capacity: a policy's per-page maps (CP_PAGE_MAP, CP_GHOST_MAP,
 * CP_PAGE_ARRAY in bpf/include/cache_ext_policy.h) are sized before the
 * policy loads, from the number of 4 KiB pages the cgroup may hold: its
 * memory limit, or the nearest ancestor's, or the host's memory where no
 * limit is set (or --capacity).  Each such map has a read-only marker
 * cp_per_page__<map> in the object (entries per page); the capacity
 * itself goes into the policy's cp_capacity and its cp_stats map, which
 * is pinned beside the link as PIN_ROOT/<cgroup id>/cp_stats.  A swap
 * sizes the new policy for the limit at that time, so after raising a
 * limit a swap to the same policy resizes it.  `stats` prints the
 * capacity and how many pages the policy had no room for (a per-page map
 * was full: the cgroup held more pages than the capacity), as
 * "capacity N" and "overflow N" lines.
 *
 * Success prints one line starting with "ok" on stdout; failure prints one
 * line on stderr saying what was refused and why (the verifier's last
 * words when it refused a program), and exits 1 (2 for a usage error).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>

#define DEFAULT_PIN_ROOT "/sys/fs/bpf/cachepilot"
#define STATS_MAP "cp_stats"
#define PER_PAGE_PREFIX "cp_per_page__"
#define PAGE_BYTES 4096ULL
#define MIN_LRU_ENTRIES 1024	/* the kernel's LRU lists want some room */
#define MAX_ROOTS 16
#define MAX_TIDS 4096
#define LOG_LINES 8

static const char *pin_root = DEFAULT_PIN_ROOT;
static char policy_dir[PATH_MAX];
static const char *roots[MAX_ROOTS];
static int nr_roots;
static unsigned long long capacity_override;

/* The last lines libbpf printed, to explain a refusal in one line. */
static char log_ring[LOG_LINES][256];
static int log_next;
/* The verifier's last telling line, when it refused a program. */
static char verifier_said[256];

static int is_noise(const char *l)
{
	return !*l || strstr(l, "PROG LOAD LOG --") ||
	       !strncmp(l, "processed ", 10) ||
	       !strncmp(l, "verification time", 17) ||
	       !strncmp(l, "stack depth", 11);
}

/*
 * libbpf's messages, kept as their last telling line: a verifier log
 * arrives as one message of many lines whose last ones say why.
 */
static int libbpf_log(enum libbpf_print_level level, const char *fmt,
		      va_list ap)
{
	static char buf[1 << 16];
	char *line, *end;

	if (level == LIBBPF_DEBUG)
		return 0;
	vsnprintf(buf, sizeof(buf), fmt, ap);
	for (end = buf + strlen(buf); end > buf; end = line) {
		for (line = end; line > buf && line[-1] != '\n'; line--)
			;
		if (line > buf)
			line[-1] = '\0';
		while (*line == ' ' || *line == '\t')
			line++;
		if (!is_noise(line)) {
			snprintf(log_ring[log_next++ % LOG_LINES],
				 sizeof(log_ring[0]), "%s", line);
			if (strstr(buf, "PROG LOAD LOG"))
				snprintf(verifier_said, sizeof(verifier_said),
					 "verifier: %s", line);
			break;
		}
		if (line > buf)
			line--;
	}
	return 0;
}

/* The most telling thing libbpf said: the last verifier or error line. */
static const char *libbpf_said(void)
{
	int i;

	if (*verifier_said)
		return verifier_said;
	for (i = 1; i <= LOG_LINES && i <= log_next; i++) {
		const char *l = log_ring[(log_next - i) % LOG_LINES];

		if (*l && !strstr(l, "failed to load object") &&
		    !strstr(l, "failed to load BPF skeleton"))
			return l;
	}
	return "";
}

static void fail(const char *fmt, ...)
{
	va_list ap;
	const char *said = libbpf_said();

	fputs("policyctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	if (*said)
		fprintf(stderr, " (%s%s)", strncmp(said, "libbpf: ", 8) &&
			strncmp(said, "verifier: ", 10) ? "libbpf: " : "", said);
	fputc('\n', stderr);
	exit(1);
}

static void usage(void)
{
	fputs("usage: policyctl [--policy-dir DIR] [--pin-root DIR] [--root DIR]...\n"
	      "                 [--capacity PAGES] COMMAND\n"
	      "  attach CGROUP POLICY [MAP=TID,...]...\n"
	      "  swap   CGROUP POLICY [MAP=TID,...]...\n"
	      "  detach CGROUP\n"
	      "  tids   CGROUP MAP [TID...]\n"
	      "  drop   CGROUP_ID\n"
	      "  list\n"
	      "  stats  CGROUP\n", stderr);
	exit(2);
}

/* -- names and paths ------------------------------------------------------ */

static int valid_name(const char *s)
{
	size_t n = strlen(s), i;

	if (!n || n > 31)
		return 0;
	for (i = 0; i < n; i++)
		if (!(s[i] == '_' || (s[i] >= 'a' && s[i] <= 'z') ||
		      (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9')))
			return 0;
	return 1;
}

static int under(const char *real, const char *dir)
{
	char rdir[PATH_MAX];
	size_t n;

	if (!realpath(dir, rdir))
		return 0;
	n = strlen(rdir);
	if (n == 1)
		return 1;
	return !strncmp(real, rdir, n) && (real[n] == '/' || real[n] == '\0');
}

/* The policy object of a bare policy name, inside the policy directory. */
static void policy_object(const char *name, char *out)
{
	char path[PATH_MAX + 64], real[PATH_MAX];

	if (!valid_name(name))
		fail("%s: not a policy name (letters, digits and _ only, "
		     "no paths)", name);
	snprintf(path, sizeof(path), "%s/%s.bpf.o", policy_dir, name);
	if (!realpath(path, real))
		fail("no policy %s in %s (%s)", name, policy_dir, strerror(errno));
	if (!under(real, policy_dir))
		fail("%s: resolves outside the policy directory %s", path,
		     policy_dir);
	strcpy(out, real);
}

/* Open a cgroup directory the options allow; returns its fd and id. */
static int open_cgroup(const char *path, unsigned long long *id)
{
	char real[PATH_MAX];
	struct stat st;
	int i, fd, ok = !nr_roots;

	if (!realpath(path, real))
		fail("cgroup %s: %s", path, strerror(errno));
	for (i = 0; i < nr_roots && !ok; i++)
		ok = under(real, roots[i]);
	if (!ok)
		fail("cgroup %s is outside the configured roots; not touched",
		     path);
	fd = open(real, O_RDONLY | O_DIRECTORY);
	if (fd < 0 || fstat(fd, &st))
		fail("cgroup %s: %s", path, strerror(errno));
	*id = (unsigned long long)st.st_ino;
	return fd;
}

static void pin_path(char *out, unsigned long long id, const char *leaf)
{
	snprintf(out, PATH_MAX, "%s/%llu%s%s", pin_root, id, leaf ? "/" : "",
		 leaf ? leaf : "");
}

static void make_pin_dir(unsigned long long id)
{
	char dir[PATH_MAX];

	if (mkdir(pin_root, 0700) && errno != EEXIST)
		fail("cannot create %s: %s (is bpffs mounted at /sys/fs/bpf?)",
		     pin_root, strerror(errno));
	pin_path(dir, id, NULL);
	if (mkdir(dir, 0700) && errno != EEXIST)
		fail("cannot create %s: %s", dir, strerror(errno));
}

/* Remove every pin of a cgroup id and its folder; returns the count. */
static int unpin_all(unsigned long long id)
{
	char dir[PATH_MAX], path[PATH_MAX * 2];
	struct dirent *e;
	int n = 0;
	DIR *d;

	pin_path(dir, id, NULL);
	d = opendir(dir);
	if (!d)
		return 0;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (!unlink(path))
			n++;
	}
	closedir(d);
	rmdir(dir);
	return n;
}

/* -- thread-id maps --------------------------------------------------------- */

static int is_tid_map(const struct bpf_map *map)
{
	const char *name = bpf_map__name(map);
	size_t n = strlen(name);

	return bpf_map__key_size(map) == 4 && n >= 4 &&
	       !strcmp(name + n - 4, "tids");
}

static int parse_tids(const char *list, unsigned int *tids)
{
	char *copy = strdup(list), *tok, *save = NULL;
	int n = 0;

	for (tok = strtok_r(copy, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		char *end;
		unsigned long v = strtoul(tok, &end, 10);

		if (*end || !v || v >= (1UL << 22) || n == MAX_TIDS)
			fail("%s: not a thread id (1..4194303)", tok);
		tids[n++] = (unsigned int)v;
	}
	free(copy);
	return n;
}

/* Make the map hold exactly these tids. */
static void set_tids(int fd, const char *what, const unsigned int *tids, int n)
{
	struct bpf_map_info info = {};
	__u32 len = sizeof(info), key, next, *stale;
	unsigned char value[64] = { 1 };
	int i, j, nstale = 0, err;

	if (bpf_map_get_info_by_fd(fd, &info, &len))
		fail("%s: %s", what, strerror(errno));
	if (info.key_size != 4 || info.value_size < 1 ||
	    info.value_size > sizeof(value))
		fail("%s: not a thread-id map (want 4-byte keys)", what);
	stale = calloc(info.max_entries + 1, sizeof(*stale));
	err = bpf_map_get_next_key(fd, NULL, &key);
	while (!err && stale) {
		int keep = 0;

		for (j = 0; j < n && !keep; j++)
			keep = tids[j] == key;
		if (!keep)
			stale[nstale++] = key;
		err = bpf_map_get_next_key(fd, &key, &next);
		key = next;
	}
	for (i = 0; i < nstale; i++)
		bpf_map_delete_elem(fd, &stale[i]);
	free(stale);
	for (i = 0; i < n; i++)
		if (bpf_map_update_elem(fd, &tids[i], value, BPF_ANY))
			fail("%s: cannot add tid %u: %s", what, tids[i],
			     strerror(errno));
}

/* -- capacity ---------------------------------------------------------------- */

/* A cgroup memory file holding bytes; 0 when absent or unlimited. */
static unsigned long long limit_file(const char *dir, const char *name)
{
	char path[PATH_MAX + 64], buf[64];
	unsigned long long v;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "r");
	if (!f)
		return 0;
	if (!fgets(buf, sizeof(buf), f) || !strncmp(buf, "max", 3)) {
		fclose(f);
		return 0;
	}
	fclose(f);
	v = strtoull(buf, NULL, 10);
	/* cgroup v1 says "no limit" with a number near 2^63 */
	return v >= (1ULL << 62) ? 0 : v;
}

/*
 * Pages the cgroup may hold: the smallest memory limit on the way up from
 * it (cgroup v2 memory.max, v1 memory.limit_in_bytes), at most the
 * host's memory.
 */
static unsigned long long cgroup_capacity(const char *cgroup)
{
	unsigned long long bytes, limit;
	char dir[PATH_MAX], probe[PATH_MAX + 16];
	char *slash;

	if (capacity_override)
		return capacity_override;
	bytes = (unsigned long long)sysconf(_SC_PHYS_PAGES) *
		(unsigned long long)sysconf(_SC_PAGESIZE);
	if (realpath(cgroup, dir)) {
		for (;;) {
			limit = limit_file(dir, "memory.max");
			if (!limit)
				limit = limit_file(dir, "memory.limit_in_bytes");
			if (limit && limit < bytes)
				bytes = limit;
			/* up to the parent, while it is a cgroup too */
			slash = strrchr(dir, '/');
			if (!slash || slash == dir)
				break;
			*slash = '\0';
			snprintf(probe, sizeof(probe), "%s/cgroup.procs", dir);
			if (access(probe, F_OK))
				break;
		}
	}
	return bytes / PAGE_BYTES ? bytes / PAGE_BYTES : 1;
}

/* Where var `name` sits in the object's .rodata, or -1. */
static long rodata_offset(struct bpf_object *obj, const char *name)
{
	const struct btf *btf = bpf_object__btf(obj);
	const struct btf_var_secinfo *vs;
	const struct btf_type *sec;
	int id, i;

	if (!btf)
		return -1;
	id = btf__find_by_name_kind(btf, ".rodata", BTF_KIND_DATASEC);
	if (id < 0)
		return -1;
	sec = btf__type_by_id(btf, id);
	vs = btf_var_secinfos(sec);
	for (i = 0; i < btf_vlen(sec); i++, vs++) {
		const struct btf_type *var = btf__type_by_id(btf, vs->type);

		if (!strcmp(btf__name_by_offset(btf, var->name_off), name))
			return vs->offset;
	}
	return -1;
}

static struct bpf_map *rodata_map(struct bpf_object *obj)
{
	struct bpf_map *map;

	bpf_object__for_each_map(map, obj) {
		const char *n = bpf_map__name(map);
		size_t len = strlen(n);

		if (bpf_map__is_internal(map) && len >= 7 &&
		    !strcmp(n + len - 7, ".rodata"))
			return map;
	}
	return NULL;
}

/*
 * Size every map that has a cp_per_page__<map> marker to its entries per
 * page times the capacity, and tell the policy its capacity.
 */
static void size_maps(struct bpf_object *obj, const char *policy,
		      unsigned long long pages)
{
	struct bpf_map *rodata = rodata_map(obj), *map;
	char var[128];
	size_t size = 0;
	char *data;
	long off;

	if (!rodata)
		return;
	data = bpf_map__initial_value(rodata, &size);
	if (!data)
		return;
	bpf_object__for_each_map(map, obj) {
		unsigned long long per_page, entries;
		__u32 v;

		snprintf(var, sizeof(var), PER_PAGE_PREFIX "%s",
			 bpf_map__name(map));
		off = rodata_offset(obj, var);
		if (off < 0 || (size_t)off + sizeof(v) > size)
			continue;
		memcpy(&v, data + off, sizeof(v));
		per_page = v ? v : 1;
		entries = per_page * pages;
		if (bpf_map__type(map) == BPF_MAP_TYPE_LRU_HASH &&
		    entries < MIN_LRU_ENTRIES)
			entries = MIN_LRU_ENTRIES;
		if (entries > UINT32_MAX)
			entries = UINT32_MAX;
		if (bpf_map__set_max_entries(map, (__u32)entries))
			fail("%s: cannot size map %s to %llu entries", policy,
			     bpf_map__name(map), entries);
	}
	off = rodata_offset(obj, "cp_capacity");
	if (off >= 0 && (size_t)off + sizeof(__u64) <= size) {
		__u64 c = pages;

		memcpy(data + off, &c, sizeof(c));
	}
}

/* After load: the stats map starts with the capacity, nothing counted. */
static void init_stats(struct bpf_object *obj, unsigned long long pages)
{
	struct bpf_map *map = bpf_object__find_map_by_name(obj, STATS_MAP);
	__u64 value[2] = { pages, 0 };
	__u32 zero = 0;

	if (map && bpf_map__value_size(map) >= sizeof(value))
		bpf_map_update_elem(bpf_map__fd(map), &zero, value, BPF_ANY);
}

/* -- loading ---------------------------------------------------------------- */

struct loaded {
	struct bpf_object *obj;
	struct bpf_map *ops;
	char name[64];
	unsigned long long capacity;	/* pages the maps were sized for */
};

static void load_policy(const char *policy, const char *cgroup, int argc,
			char **argv, struct loaded *out)
{
	static unsigned int tids[MAX_TIDS];
	char path[PATH_MAX];
	struct bpf_map *map;
	int i, err;

	policy_object(policy, path);
	out->obj = bpf_object__open_file(path, NULL);
	if (!out->obj)
		fail("%s: cannot open %s: %s", policy, path, strerror(errno));
	out->ops = NULL;
	bpf_object__for_each_map(map, out->obj)
		if (bpf_map__type(map) == BPF_MAP_TYPE_STRUCT_OPS)
			out->ops = map;
	if (!out->ops)
		fail("%s: %s has no struct_ops map (not a cache_ext policy)",
		     policy, path);
	snprintf(out->name, sizeof(out->name), "%s", bpf_map__name(out->ops));
	out->capacity = cgroup_capacity(cgroup);
	size_maps(out->obj, policy, out->capacity);
	err = bpf_object__load(out->obj);
	if (err)
		fail("%s: the kernel refused to load it: %s", policy,
		     strerror(-err));
	init_stats(out->obj, out->capacity);
	/* MAP=TID,... configures the instance before it runs */
	for (i = 0; i < argc; i++) {
		char *eq = strchr(argv[i], '=');
		int fd, n;

		if (!eq)
			fail("%s: expected MAP=TID,TID...", argv[i]);
		*eq = '\0';
		map = bpf_object__find_map_by_name(out->obj, argv[i]);
		if (!map || !is_tid_map(map))
			fail("%s: policy %s has no thread-id map %s", argv[i],
			     policy, argv[i]);
		n = parse_tids(eq + 1, tids);
		fd = bpf_map__fd(map);
		set_tids(fd, argv[i], tids, n);
	}
}

/* Pin the instance's thread-id maps and its cp_stats beside its link,
 * replacing old pins. */
static void pin_tid_maps(struct loaded *l, unsigned long long id)
{
	char path[PATH_MAX];
	struct bpf_map *map;

	bpf_object__for_each_map(map, l->obj) {
		if (!is_tid_map(map) && strcmp(bpf_map__name(map), STATS_MAP))
			continue;
		pin_path(path, id, bpf_map__name(map));
		unlink(path);
		if (bpf_obj_pin(bpf_map__fd(map), path))
			fail("pin %s: %s", path, strerror(errno));
	}
}

/* Remove pinned tid maps that the new policy does not have. */
static void unpin_foreign_maps(struct loaded *l, unsigned long long id)
{
	char dir[PATH_MAX], path[PATH_MAX * 2];
	struct dirent *e;
	DIR *d;

	pin_path(dir, id, NULL);
	d = opendir(dir);
	if (!d)
		return;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.' || !strcmp(e->d_name, "link"))
			continue;
		if (bpf_object__find_map_by_name(l->obj, e->d_name))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		unlink(path);
	}
	closedir(d);
}

/*
 * libbpf (1.5) uploads a struct_ops map's value only in
 * bpf_map__attach_struct_ops(), which then creates the link with
 * target_fd 0.  The cache_ext kernel takes the governed cgroup from
 * target_fd, so fd 0 is the cgroup for the duration of that call.
 */
static struct bpf_link *link_to_cgroup(struct bpf_map *ops, int cgfd)
{
	struct bpf_link *link;
	int saved = dup(0), err;

	if (saved < 0 || dup2(cgfd, 0) < 0)
		fail("dup2: %s", strerror(errno));
	link = bpf_map__attach_struct_ops(ops);
	err = errno;
	dup2(saved, 0);
	close(saved);
	errno = err;
	return link;
}

static const char *attach_error(int err)
{
	switch (err) {
	case EBUSY:
		return "the cgroup already has a cache_ext policy";
	case EOPNOTSUPP:
		return "the memory controller is not enabled on that cgroup";
	case EBADF:
	case ENOTDIR:
		return "not a cgroup directory";
	default:
		return strerror(err);
	}
}

/* -- commands ---------------------------------------------------------------- */

static int cmd_attach(const char *cgroup, const char *policy, int argc,
		      char **argv)
{
	unsigned long long id;
	char path[PATH_MAX];
	struct bpf_link *link;
	struct loaded l;
	int cgfd;

	cgfd = open_cgroup(cgroup, &id);
	load_policy(policy, cgroup, argc, argv, &l);
	link = link_to_cgroup(l.ops, cgfd);
	if (!link)
		fail("%s on %s: not attached: %s", policy, cgroup,
		     attach_error(errno));
	make_pin_dir(id);
	pin_path(path, id, "link");
	unlink(path);	/* a stale pin of an inert link */
	if (bpf_link__pin(link, path)) {
		int err = errno;

		bpf_link__destroy(link);
		errno = err;
		fail("pin %s: %s", path, strerror(err));
	}
	pin_tid_maps(&l, id);
	unpin_foreign_maps(&l, id);
	printf("ok attached %s to %s (cgroup id %llu, pinned at %s, "
	       "capacity %llu pages)\n", policy, cgroup, id, path, l.capacity);
	return 0;
}

static int cmd_swap(const char *cgroup, const char *policy, int argc,
		    char **argv)
{
	unsigned long long id;
	char path[PATH_MAX];
	struct bpf_link *link;
	struct loaded l;
	int cgfd, err;

	cgfd = open_cgroup(cgroup, &id);
	pin_path(path, id, "link");
	link = bpf_link__open(path);
	if (!link) {
		close(cgfd);
		return cmd_attach(cgroup, policy, argc, argv);
	}
	close(cgfd);
	load_policy(policy, cgroup, argc, argv, &l);
	err = bpf_link__update_map(link, l.ops);
	if (err)
		fail("%s on %s: not swapped, the previous policy stays: %s",
		     policy, cgroup, strerror(-err));
	pin_tid_maps(&l, id);
	unpin_foreign_maps(&l, id);
	printf("ok swapped %s in on %s (cgroup id %llu, capacity %llu pages)\n",
	       policy, cgroup, id, l.capacity);
	return 0;
}

static int cmd_detach(const char *cgroup)
{
	unsigned long long id;
	char path[PATH_MAX];
	int cgfd, fd;

	cgfd = open_cgroup(cgroup, &id);
	close(cgfd);
	pin_path(path, id, "link");
	fd = bpf_obj_get(path);
	if (fd < 0)
		fail("%s: no policy pinned at %s", cgroup, path);
	if (bpf_link_detach(fd))
		fail("%s: detach: %s", cgroup, strerror(errno));
	close(fd);
	unpin_all(id);
	printf("ok detached the policy of %s (cgroup id %llu)\n", cgroup, id);
	return 0;
}

static int cmd_tids(const char *cgroup, const char *map, int argc, char **argv)
{
	static unsigned int tids[MAX_TIDS];
	unsigned long long id;
	char path[PATH_MAX];
	int cgfd, fd, i, n = 0;

	if (!valid_name(map))
		fail("%s: not a map name", map);
	cgfd = open_cgroup(cgroup, &id);
	close(cgfd);
	for (i = 0; i < argc; i++)
		n += parse_tids(argv[i], tids + n);
	pin_path(path, id, map);
	fd = bpf_obj_get(path);
	if (fd < 0)
		fail("%s: no map %s pinned for it (%s)", cgroup, map, path);
	set_tids(fd, map, tids, n);
	printf("ok %s of %s holds %d thread id(s)\n", map, cgroup, n);
	return 0;
}

static int cmd_drop(const char *cgid)
{
	char *end;
	unsigned long long id = strtoull(cgid, &end, 10);
	int n;

	if (*end || !id)
		fail("%s: not a cgroup id", cgid);
	n = unpin_all(id);
	printf("ok dropped %d pin(s) of cgroup id %llu\n", n, id);
	return 0;
}

static int cmd_list(void)
{
	char path[PATH_MAX];
	struct dirent *e;
	DIR *d = opendir(pin_root);

	if (!d)
		return 0;
	while ((e = readdir(d))) {
		struct bpf_link_info info = {};
		struct bpf_map_info minfo = {};
		__u32 len = sizeof(info), mlen = sizeof(minfo);
		char *end;
		unsigned long long id = strtoull(e->d_name, &end, 10);
		int fd, mfd;

		if (*end || !id)
			continue;
		pin_path(path, id, "link");
		fd = bpf_obj_get(path);
		if (fd < 0) {
			printf("%llu -\n", id);
			continue;
		}
		if (!bpf_link_get_info_by_fd(fd, &info, &len) &&
		    (mfd = bpf_map_get_fd_by_id(info.struct_ops.map_id)) >= 0) {
			if (!bpf_map_get_info_by_fd(mfd, &minfo, &mlen))
				printf("%llu %s\n", id, minfo.name);
			else
				printf("%llu ?\n", id);
			close(mfd);
		} else {
			printf("%llu ?\n", id);
		}
		close(fd);
	}
	closedir(d);
	return 0;
}

static int cmd_stats(const char *cgroup)
{
	unsigned long long id;
	char path[PATH_MAX];
	__u64 value[2] = { 0, 0 };
	__u32 zero = 0;
	int cgfd, fd;

	cgfd = open_cgroup(cgroup, &id);
	close(cgfd);
	pin_path(path, id, STATS_MAP);
	fd = bpf_obj_get(path);
	if (fd < 0)
		fail("%s: no policy statistics pinned at %s", cgroup, path);
	if (bpf_map_lookup_elem(fd, &zero, value))
		fail("%s: cannot read %s: %s", cgroup, path, strerror(errno));
	close(fd);
	printf("capacity %llu\noverflow %llu\n", (unsigned long long)value[0],
	       (unsigned long long)value[1]);
	return 0;
}

int main(int argc, char **argv)
{
	char exe[PATH_MAX];
	ssize_t n;
	int i = 1;

	libbpf_set_print(libbpf_log);
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	exe[n > 0 ? n : 0] = '\0';
	snprintf(policy_dir, sizeof(policy_dir), "%s/policies",
		 n > 0 ? dirname(exe) : ".");
	for (; i < argc && !strncmp(argv[i], "--", 2); i += 2) {
		if (i + 1 >= argc)
			usage();
		if (!strcmp(argv[i], "--policy-dir")) {
			if (!realpath(argv[i + 1], policy_dir))
				fail("--policy-dir %s: %s", argv[i + 1],
				     strerror(errno));
		} else if (!strcmp(argv[i], "--pin-root")) {
			pin_root = argv[i + 1];
		} else if (!strcmp(argv[i], "--root") && nr_roots < MAX_ROOTS) {
			roots[nr_roots++] = argv[i + 1];
		} else if (!strcmp(argv[i], "--capacity")) {
			char *end;

			capacity_override = strtoull(argv[i + 1], &end, 10);
			/* strtoull takes "-1" for 2^64 - 1: digits only */
			if (*argv[i + 1] < '0' || *argv[i + 1] > '9' || *end ||
			    !capacity_override)
				fail("--capacity %s: not a number of pages",
				     argv[i + 1]);
		} else {
			usage();
		}
	}
	argc -= i;
	argv += i;
	if (argc < 1)
		usage();
	if (!strcmp(argv[0], "attach") && argc >= 3)
		return cmd_attach(argv[1], argv[2], argc - 3, argv + 3);
	if (!strcmp(argv[0], "swap") && argc >= 3)
		return cmd_swap(argv[1], argv[2], argc - 3, argv + 3);
	if (!strcmp(argv[0], "detach") && argc == 2)
		return cmd_detach(argv[1]);
	if (!strcmp(argv[0], "tids") && argc >= 3)
		return cmd_tids(argv[1], argv[2], argc - 3, argv + 3);
	if (!strcmp(argv[0], "drop") && argc == 2)
		return cmd_drop(argv[1]);
	if (!strcmp(argv[0], "list") && argc == 1)
		return cmd_list();
	if (!strcmp(argv[0], "stats") && argc == 2)
		return cmd_stats(argv[1]);
	usage();
	return 2;
}
