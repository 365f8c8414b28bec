// SPDX-License-Identifier: GPL-2.0
/*
 * cxtest: the in-VM helper of the cache_ext tests.
 *
 *   cxtest attach OBJ CGROUP_DIR PIN   load OBJ's cache_ext_ops map, link it
 *                                      to the cgroup, pin the link at PIN
 *   cxtest update PIN OBJ              replace the policy behind a link
 *   cxtest detach PIN                  detach the link and remove the pin
 *   cxtest load OBJ                    load only (exit 0 iff the verifier
 *                                      accepts every program)
 *   cxtest mkfile PATH MIB             write a file of MIB MiB whose every
 *                                      8-byte word holds its own offset
 *   cxtest read PATH [CGROUP_DIR]      join the cgroup, then read PATH once
 *                                      front to back, page by page, with
 *                                      readahead off
 *   cxtest verify PATH [CGROUP_DIR]    like read, and check every word
 *                                      against the mkfile pattern
 *   cxtest bypass OBJ CGROUP_DIR PIN PATH
 *                                      attach OBJ (a policy with an af_tids
 *                                      map, such as admit_filter) like
 *                                      attach, register this thread in
 *                                      af_tids, then verify PATH in the
 *                                      cgroup
 *   cxtest dontneed PATH               posix_fadvise(POSIX_FADV_DONTNEED)
 *                                      on all of PATH
 *   cxtest res PATH                    residency (percent) of the first
 *                                      eighth, the last eighth and all of
 *                                      PATH, from mincore(): "H T A"
 *
 * Statically linked against the kernel tree's libbpf.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#define PAGE 4096

static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("cxtest: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

/* Open PATH (dying if it cannot be read) and try to load it into the
 * kernel: the load's error, 0 if it loaded; *objp is set either way. */
static int open_and_load(const char *path, struct bpf_object **objp)
{
	*objp = bpf_object__open_file(path, NULL);
	if (!*objp)
		die("cannot open %s: %s", path, strerror(errno));
	return bpf_object__load(*objp);
}

/* Open and load OBJ; return its (single) struct_ops map. */
static struct bpf_map *load_policy(const char *path, struct bpf_object **objp)
{
	struct bpf_object *obj;
	struct bpf_map *map;
	int err;

	err = open_and_load(path, &obj);
	if (err)
		die("cannot load %s: %s", path, strerror(-err));
	bpf_object__for_each_map(map, obj)
		if (bpf_map__type(map) == BPF_MAP_TYPE_STRUCT_OPS) {
			*objp = obj;
			return map;
		}
	die("%s has no struct_ops map", path);
	return NULL;
}

/*
 * libbpf (1.5) uploads a struct_ops map's kernel value only inside
 * bpf_map__attach_struct_ops(), which then calls
 * bpf_link_create(map_fd, 0, BPF_STRUCT_OPS).  The kernel reads the target
 * cgroup from target_fd, so we make fd 0 the cgroup (or, for a map that
 * only has to be uploaded, something that is no cgroup) for that call.
 */
static struct bpf_link *attach_with_fd0(struct bpf_map *map, int fd0)
{
	struct bpf_link *link;
	int saved = dup(0);

	if (saved < 0 || dup2(fd0, 0) < 0)
		die("dup2: %s", strerror(errno));
	link = bpf_map__attach_struct_ops(map);
	if (dup2(saved, 0) < 0)
		die("dup2: %s", strerror(errno));
	close(saved);
	return link;
}

static struct bpf_object *attach_policy(const char *objpath,
					const char *cgpath, const char *pin)
{
	struct bpf_object *obj;
	struct bpf_link *link;
	struct bpf_map *map;
	int cgfd;

	map = load_policy(objpath, &obj);
	cgfd = open(cgpath, O_RDONLY | O_DIRECTORY);
	if (cgfd < 0)
		die("cannot open cgroup %s: %s", cgpath, strerror(errno));
	/* link_create.target_fd names the cgroup the policy governs */
	link = attach_with_fd0(map, cgfd);
	if (!link)
		die("link_create on %s: %s", cgpath, strerror(errno));
	if (bpf_link__pin(link, pin))
		die("pin %s: %s", pin, strerror(errno));
	return obj;
}

static int cmd_attach(const char *objpath, const char *cgpath, const char *pin)
{
	attach_policy(objpath, cgpath, pin);
	return 0;
}

static int cmd_update(const char *pin, const char *objpath)
{
	struct bpf_object *obj;
	struct bpf_link *scratch;
	struct bpf_map *map;
	int link, null;

	link = bpf_obj_get(pin);
	if (link < 0)
		die("no link pinned at %s: %s", pin, strerror(errno));
	map = load_policy(objpath, &obj);
	/*
	 * Upload the new map's value; the link libbpf then tries to create
	 * on /dev/null is refused by the kernel (not a cgroup), as intended.
	 */
	null = open("/dev/null", O_RDONLY);
	scratch = attach_with_fd0(map, null);
	if (scratch)
		die("a struct_ops link was created on /dev/null");
	if (bpf_link_update(link, bpf_map__fd(map), NULL))
		die("link_update: %s", strerror(errno));
	return 0;
}

static int cmd_detach(const char *pin)
{
	int link = bpf_obj_get(pin);

	if (link < 0)
		die("no link pinned at %s: %s", pin, strerror(errno));
	if (bpf_link_detach(link))
		die("link_detach: %s", strerror(errno));
	if (unlink(pin))
		die("unlink %s: %s", pin, strerror(errno));
	return 0;
}

static int cmd_load(const char *objpath)
{
	struct bpf_object *obj;
	int err;

	err = open_and_load(objpath, &obj);
	bpf_object__close(obj);
	if (err) {
		fprintf(stderr, "cxtest: load of %s refused: %s\n", objpath,
			strerror(-err));
		return 1;
	}
	return 0;
}

/* Every 8-byte word of a test file holds its offset: a misplaced page shows. */
#define WORDS_PER_CHUNK 8192

static int cmd_mkfile(const char *path, long mib)
{
	static unsigned long long buf[WORDS_PER_CHUNK];
	long i, j, n = mib * (1 << 20) / (long)sizeof(buf);
	int fd;

	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		die("create %s: %s", path, strerror(errno));
	for (i = 0; i < n; i++) {
		for (j = 0; j < WORDS_PER_CHUNK; j++)
			buf[j] = (unsigned long long)(i * WORDS_PER_CHUNK + j) * 8;
		if (write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf))
			die("write %s: %s", path, strerror(errno));
	}
	if (fsync(fd) || close(fd))
		die("fsync %s: %s", path, strerror(errno));
	return 0;
}

static void join_cgroup(const char *cgpath)
{
	char procs[4096];
	FILE *f;

	snprintf(procs, sizeof(procs), "%s/cgroup.procs", cgpath);
	f = fopen(procs, "w");
	if (!f || fprintf(f, "%d\n", getpid()) < 0 || fclose(f))
		die("cannot join %s: %s", cgpath, strerror(errno));
}

/*
 * Join CGPATH (when given) and open PATH for reading one page per read
 * with readahead off, so that the policy sees every page.
 */
static int open_pagewise(const char *path, const char *cgpath)
{
	int fd;

	if (cgpath)
		join_cgroup(cgpath);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		die("open %s: %s", path, strerror(errno));
	posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
	return fd;
}

static int cmd_read(const char *path, const char *cgpath)
{
	char buf[PAGE];
	off_t off = 0;
	ssize_t n;
	int fd = open_pagewise(path, cgpath);

	while ((n = pread(fd, buf, sizeof(buf), off)) > 0)
		off += n;
	if (n < 0)
		die("read %s: %s", path, strerror(errno));
	close(fd);
	return 0;
}

/* Read PATH page by page, checking every word against the mkfile pattern. */
static int cmd_verify(const char *path, const char *cgpath)
{
	unsigned long long buf[PAGE / 8];
	off_t off = 0;
	ssize_t n, i;
	int fd = open_pagewise(path, cgpath);

	while ((n = pread(fd, buf, sizeof(buf), off)) > 0) {
		for (i = 0; i < n / 8; i++)
			if (buf[i] != (unsigned long long)(off + i * 8))
				die("%s: the word at %lld holds %llu", path,
				    (long long)(off + i * 8), buf[i]);
		off += n;
	}
	if (n < 0)
		die("read %s: %s", path, strerror(errno));
	close(fd);
	printf("verified %lld bytes\n", (long long)off);
	return 0;
}

static int cmd_bypass(const char *objpath, const char *cgpath,
		      const char *pin, const char *path)
{
	struct bpf_object *obj = attach_policy(objpath, cgpath, pin);
	__u32 tid = (__u32)syscall(SYS_gettid);
	struct bpf_map *tids;
	__u8 one = 1;

	tids = bpf_object__find_map_by_name(obj, "af_tids");
	if (!tids)
		die("%s has no af_tids map", objpath);
	if (bpf_map__update_elem(tids, &tid, sizeof(tid), &one, sizeof(one), 0))
		die("register tid %u: %s", tid, strerror(errno));
	return cmd_verify(path, cgpath);
}

static int cmd_dontneed(const char *path)
{
	int fd = open(path, O_RDONLY), err;

	if (fd < 0)
		die("open %s: %s", path, strerror(errno));
	err = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	if (err)
		die("fadvise %s: %s", path, strerror(err));
	close(fd);
	return 0;
}

static int cmd_res(const char *path)
{
	long pages, eighth, i, head = 0, tail = 0, all = 0;
	unsigned char *vec;
	struct stat st;
	void *map;
	int fd;

	fd = open(path, O_RDONLY);
	if (fd < 0 || fstat(fd, &st))
		die("open %s: %s", path, strerror(errno));
	pages = (st.st_size + PAGE - 1) / PAGE;
	if (pages < 8)
		die("%s is too small", path);
	map = mmap(NULL, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		die("mmap %s: %s", path, strerror(errno));
	vec = malloc(pages);
	if (!vec || mincore(map, st.st_size, vec))
		die("mincore %s: %s", path, strerror(errno));
	eighth = pages / 8;
	for (i = 0; i < pages; i++) {
		int r = vec[i] & 1;

		all += r;
		if (i < eighth)
			head += r;
		if (i >= pages - eighth)
			tail += r;
	}
	printf("%ld %ld %ld\n", head * 100 / eighth, tail * 100 / eighth,
	       all * 100 / pages);
	return 0;
}

static int print_all(enum libbpf_print_level level, const char *fmt,
		     va_list ap)
{
	return vfprintf(stderr, fmt, ap);
}

int main(int argc, char **argv)
{
	const char *cmd = argc > 1 ? argv[1] : "";

	/* CXTEST_DEBUG=1: libbpf's debug output too */
	if (getenv("CXTEST_DEBUG"))
		libbpf_set_print(print_all);

	if (!strcmp(cmd, "attach") && argc == 5)
		return cmd_attach(argv[2], argv[3], argv[4]);
	if (!strcmp(cmd, "update") && argc == 4)
		return cmd_update(argv[2], argv[3]);
	if (!strcmp(cmd, "detach") && argc == 3)
		return cmd_detach(argv[2]);
	if (!strcmp(cmd, "load") && argc == 3)
		return cmd_load(argv[2]);
	if (!strcmp(cmd, "mkfile") && argc == 4)
		return cmd_mkfile(argv[2], atol(argv[3]));
	if (!strcmp(cmd, "read") && (argc == 3 || argc == 4))
		return cmd_read(argv[2], argc == 4 ? argv[3] : NULL);
	if (!strcmp(cmd, "verify") && (argc == 3 || argc == 4))
		return cmd_verify(argv[2], argc == 4 ? argv[3] : NULL);
	if (!strcmp(cmd, "bypass") && argc == 6)
		return cmd_bypass(argv[2], argv[3], argv[4], argv[5]);
	if (!strcmp(cmd, "dontneed") && argc == 3)
		return cmd_dontneed(argv[2]);
	if (!strcmp(cmd, "res") && argc == 3)
		return cmd_res(argv[2]);
	fprintf(stderr,
		"usage: cxtest attach OBJ CGROUP PIN | update PIN OBJ | detach PIN |\n"
		"       load OBJ | mkfile PATH MIB | read PATH [CGROUP] |\n"
		"       verify PATH [CGROUP] |\n"
		"       bypass OBJ CGROUP PIN PATH | dontneed PATH | res PATH\n");
	return 2;
}
