#!/usr/bin/env bash
# The whole suite.  Tests that need root/BPF/cgroups run for real where the
# machine has them and skip, naming what is missing, where it has not.
set -uo pipefail
cd "$(dirname "$0")/.."
# bpffs at /sys/fs/bpf, as systemd mounts it at boot on most hosts: the
# tests of pinned maps need it (without it they skip and say so)
if [ "$(id -u)" = 0 ] && [ "$(stat -f -c %T /sys/fs/bpf 2>/dev/null)" != bpf_fs ]; then
	mount -t bpf bpf /sys/fs/bpf 2>/dev/null || true
fi
.venv/bin/python -m pytest -q "$@"
rc=$?
# pytest exits 5 when it collected nothing: that is a failure for us.
exit $rc
