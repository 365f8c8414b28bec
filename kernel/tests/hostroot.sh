# Sourced by in-VM scripts booted with kernel/vm -H: mount the host's root
# file system (read-only, virtio-9p) at /host with the guest's own proc,
# sys, dev, cgroup2, bpffs and a tmpfs /tmp over it, and the data disk at
# /host/tmp/data, so that `in_host CMD` runs the host's userland (Python,
# the project's .venv, fio, db_bench) against the guest's kernel.
HOST=/host

hostroot_mount() {
	# loopback, for gRPC and the exporters' /metrics
	ifconfig lo 127.0.0.1 up 2>/dev/null || ip link set lo up
	mkdir -p $HOST
	mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot $HOST ||
		return 1
	mount -t proc proc $HOST/proc &&
	mount -t sysfs sysfs $HOST/sys &&
	mount -t cgroup2 cgroup2 $HOST/sys/fs/cgroup &&
	mount -t bpf bpf $HOST/sys/fs/bpf &&
	mount -t devtmpfs devtmpfs $HOST/dev &&
	mount -t tmpfs tmpfs $HOST/tmp &&
	mkdir -p $HOST/tmp/data &&
	mount -o bind /data $HOST/tmp/data || return 1
	# a writable host folder, when kernel/vm -W shares one
	mkdir -p $HOST/tmp/results
	mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 results \
		$HOST/tmp/results 2>/dev/null || rmdir $HOST/tmp/results
	return 0
}

# in_host DIR CMD...: run CMD in DIR of the host's userland
in_host() {
	dir=$1
	shift
	chroot $HOST /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
		HOME=/tmp TMPDIR=/tmp PYTHONDONTWRITEBYTECODE=1 LANG=C.UTF-8 \
		CACHEPILOT_VM_DATA=/tmp/data /bin/sh -c 'cd "$0" && exec "$@"' "$dir" "$@"
}
