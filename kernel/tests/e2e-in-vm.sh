#!/bin/sh
# make e2e: experiments/e2e_vm.py in the cache_ext VM, from the host's
# userland, in the repository given as the first argument; its JSON and
# PNG go to the folder kernel/vm -W shares (experiments/results).  Further
# arguments go to e2e_vm.py (make e2e E2E_ARGS="--only default_equal").
REPO=$1
shift
. /cachepilot/hostroot.sh
echo "e2e-in-vm on $(uname -r), repository $REPO"
hostroot_mount || { echo "FAIL hostroot: cannot mount the host's root"; exit 1; }
[ -d $HOST/tmp/results ] || { echo "FAIL no results folder shared (kernel/vm -W)"; exit 1; }
in_host "$REPO" .venv/bin/python experiments/e2e_vm.py --data /tmp/data --out /tmp/results "$@"
rc=$?
echo "e2e-in-vm: exit status $rc"
exit $rc
