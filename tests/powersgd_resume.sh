#!/bin/sh
# A checkpoint taken by one job and loaded by a fresh one: see powersgd_resume.cc.
set -e
run="$1"; prog="$2"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$run" -n 2 "$prog" full "$dir"
"$run" -n 2 "$prog" resume "$dir"
