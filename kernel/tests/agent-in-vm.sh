#!/bin/sh
# The project's own Python agent drives cache_ext on cgroup v2 tenants of
# the guest: tests/test_cache_ext_live.py, run from the host's userland
# (kernel/vm -H) in the repository given as the first argument.
REPO=$1
. /cachepilot/hostroot.sh
echo "agent-in-vm on $(uname -r), repository $REPO"
if ! hostroot_mount; then
	echo "FAIL hostroot: cannot mount the host's root over virtio-9p"
	exit 1
fi
in_host "$REPO" .venv/bin/python -m pytest -p no:cacheprovider -v -s -rs --color=no \
	tests/test_cache_ext_live.py
rc=$?
echo "agent-in-vm: pytest exit status $rc"
exit $rc
