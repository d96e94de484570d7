#!/usr/bin/env bash
# Regenerate the stubs into a scratch tree and fail on any difference with the committed ones.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$repo/scripts/gen_protos.sh" "$scratch"
if ! diff -ru "$repo/hetcluster/proto/v1" "$scratch/hetcluster/proto/v1" -x __pycache__; then
  echo "check_protos: committed stubs differ from protos/; run scripts/gen_protos.sh and commit." >&2
  exit 1
fi
echo "check_protos: stubs match protos/"
