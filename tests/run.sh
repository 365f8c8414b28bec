#!/usr/bin/env bash
# The whole suite.  Tests that need root/BPF/cgroups run for real where the
# machine has them and skip, naming what is missing, where it has not.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest -q "$@"
rc=$?
# pytest exits 5 when it collected nothing: that is a failure for us.
exit $rc
