#!/usr/bin/env bash
# Regenerate protocol/cachepilot_pb2*.py from protocol/cachepilot.proto.
# The generated modules are committed so that a fresh clone needs only the
# protobuf and grpcio runtimes; tests/test_service_proto.py checks they are
# up to date.  Usage: protocol/gen_proto.sh [OUTDIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here}"
py="${PYTHON:-$here/../.venv/bin/python}"
"$py" -m grpc_tools.protoc -I"$here" --python_out="$out" \
	--grpc_python_out="$out" "$here/cachepilot.proto"
# protoc writes a top-level import; the modules live in a package.
sed -i 's/^import cachepilot_pb2 as/from cachepilot.protocol import cachepilot_pb2 as/' \
	"$out/cachepilot_pb2_grpc.py"
