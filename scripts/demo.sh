#!/usr/bin/env bash
# The main job on the embedded default: grows with each feature (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
hetcluster --help
