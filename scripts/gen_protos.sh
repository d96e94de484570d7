#!/usr/bin/env bash
# Regenerate the Python and .pyi stubs of protos/hetcluster/v1/*.proto into hetcluster/proto/v1/.
# Usage: scripts/gen_protos.sh [OUTPUT_ROOT]   (OUTPUT_ROOT defaults to the repository root)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out_root=${1:-$repo}
python=${PYTHON:-$repo/.venv/bin/python}
[ -x "$python" ] || python=python3
export PATH="$(dirname "$python"):$PATH"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" -m grpc_tools.protoc -I "$repo/protos" \
  --python_out="$tmp" --grpc_python_out="$tmp" --mypy_out="$tmp" --mypy_grpc_out="$tmp" \
  "$repo"/protos/hetcluster/v1/*.proto
dest="$out_root/hetcluster/proto/v1"
mkdir -p "$dest"
rm -f "$dest"/*_pb2*.py "$dest"/*_pb2*.pyi
for f in "$tmp"/hetcluster/v1/*; do
  # protoc writes imports for the proto package path; our modules live under hetcluster.proto.v1.
  sed -e 's/^from hetcluster\.v1 import /from hetcluster.proto.v1 import /' \
      -e 's/^import hetcluster\.v1\./import hetcluster.proto.v1./' "$f" > "$dest/$(basename "$f")"
done
[ -f "$dest/__init__.py" ] || printf '"""Stubs generated from protos/hetcluster/v1."""\n' > "$dest/__init__.py"
