#!/usr/bin/env bash
# `make demo` on a fresh clone with pip's cache disabled: wall time, installs included.
# Usage: bench/fresh_demo.sh [REPO] [BRANCH]   (defaults: this repository, its current branch)
set -euo pipefail
repo="${1:-$(git rev-parse --show-toplevel)}"
branch="${2:-$(git -C "$repo" rev-parse --abbrev-ref HEAD)}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
git clone -q -b "$branch" "$repo" "$dir/clone"
cd "$dir/clone"
TIMEFORMAT="make demo from a fresh clone: %R s wall"
time PIP_NO_CACHE_DIR=1 make demo
