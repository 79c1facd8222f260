#!/usr/bin/env bash
# collie-bench's command line: every bad value echoed with its option and
# what is accepted, --help on stdout with status 0, usage printed once under
# collie-run (not once per rank), -a judged by collie-bench itself, nothing
# silently changed, every collective (-C) checked right in place and out of
# place at 3 ranks, --csv and --json parseable with a row per size, --tune
# writing a profile that a later run reads, and --plot writing a PNG.
#   command_line.sh COLLIE_RUN COLLIE_BENCH
set -uo pipefail
run=$1; bench=$2
failures=0
fail() { echo "FAILED: $*"; failures=$((failures + 1)); }
expect_usage_error() {  # message-substring args...
  local want=$1; shift
  local out rc
  out=$("$bench" "$@" 2>&1); rc=$?
  [ $rc = 2 ] || fail "collie-bench $* exited $rc, not 2"
  grep -qF -- "$want" <<<"$out" || fail "collie-bench $*: no '$want' in: $(head -1 <<<"$out")"
  grep -q "COLLIE_ALLREDUCE_ALGO" <<<"$out" && fail "collie-bench $*: blames COLLIE_ALLREDUCE_ALGO"
}
expect_usage_error "-b '1X' is not a size: give bytes with an optional K, M or G suffix" -b 1X
expect_usage_error "-a 'tree' is not an algorithm: auto ring rd" -a tree
expect_usage_error "-b (2097152 B) is larger than -e (1048576 B)" -b 2M -e 1M
expect_usage_error "-n '0': a whole number of timed samples, at least 1" -n 0
expect_usage_error "-C 'gather' is not a collective: allreduce allgather reduce_scatter" -C gather
expect_usage_error "-C alltoall runs out of place only (-i 0)" -C alltoall -i 1
expect_usage_error "-f '1': a whole number, at least 2" -f 1
expect_usage_error "-d 'f8' is not a dtype: f32 f64 f16 bf16 i32 i64 u8 i8" -d f8
expect_usage_error "-o avg is not defined on -d i32" -d i32 -o avg
expect_usage_error "unknown option '--bogus'" --bogus
expect_usage_error "-c '2': 0 (do not check) or 1 (check every result)" -c 2
expect_usage_error "-D 'gpu' is not cpu or cuda" -D gpu
# --device cuda without a GPU (here, and in CI) says why, on every rank.
out=$("$run" -n 2 "$bench" --device cuda -b 8 -e 64 -n 1 2>&1); rc=$?
if [ $rc = 0 ]; then
  grep -q "CUDA buffers" <<<"$out" || fail "--device cuda ran without saying so: $out"
else
  grep -qE "unavailable error: --device cuda: (no GPU can be used|this build of collie has no CUDA)" \
    <<<"$out" || fail "--device cuda without a GPU: $out"
fi

out=$("$bench" --help 2>/tmp/collie_bench_help_err.$$); rc=$?
[ $rc = 0 ] || fail "--help exited $rc"
grep -q "^usage: " <<<"$out" || fail "--help did not print the usage on stdout"
[ -s /tmp/collie_bench_help_err.$$ ] && fail "--help wrote to stderr"
rm -f /tmp/collie_bench_help_err.$$

out=$("$run" -n 3 "$bench" -n 0 2>&1)
n=$(grep -c "^\[.\] usage: \|^usage: " <<<"$out")
[ "$n" = 1 ] || fail "under collie-run -n 3 the usage was printed $n times"

# Every collective at 3 ranks (sizes that do not split evenly), each result
# checked by collie-bench against the known answer: the #wrong column.
for c in allreduce allgather reduce_scatter broadcast sendrecv alltoall; do
  for ip in 0 $([ "$c" = alltoall ] || echo 1); do
    out=$("$run" -n 3 "$bench" -C "$c" -i "$ip" -d f64 -o max -b 8 -e 100K -f 7 -n 2 -w 1 2>&1)
    rows=$(grep -cE '^\[0\] +[0-9]' <<<"$out")
    bad=$(grep -E '^\[0\] +[0-9]' <<<"$out" | awk '$NF != 0' | wc -l)
    [ "$rows" = 6 ] && [ "$bad" = 0 ] || fail "-C $c -i $ip: $rows rows, $bad with wrong results: $out"
  done
done
# Narrow integers whose products wrap (3 ranks' of up to 15 each): the
# known answer wraps as the dtype does (before, every wrapped product was
# counted wrong).
for d in u8 i8; do
  out=$("$run" -n 3 "$bench" -d "$d" -o prod -b 8 -e 4K -f 8 -n 2 -w 1 2>&1)
  rows=$(grep -cE '^\[0\] +[0-9]' <<<"$out")
  bad=$(grep -E '^\[0\] +[0-9]' <<<"$out" | awk '$NF != 0' | wc -l)
  [ "$rows" = 4 ] && [ "$bad" = 0 ] || fail "-d $d -o prod at 3 ranks: $rows rows, $bad with wrong results: $out"
done
out=$("$run" -n 2 "$bench" -C reduce_scatter -b 1K -e 64K -f 8 -n 2 --csv 2>&1 | sed 's/^\[0\] //')
/usr/bin/env python3 - "$out" <<'PY' || fail "--csv: $out"
import csv, io, sys
rows = list(csv.DictReader(io.StringIO(sys.argv[1])))
assert [int(r["size_bytes"]) for r in rows] == [1024, 8192, 65536], rows
assert all(r["collective"] == "reduce_scatter" and r["wrong"] == "0" and float(r["time_us"]) > 0
           and float(r["cpu_us"]) >= 0 for r in rows), rows
PY
out=$("$run" -n 2 "$bench" -C broadcast -b 8 -e 512 -f 8 -n 2 --json 2>&1 | sed 's/^\[0\] //')
/usr/bin/env python3 - "$out" <<'PY' || fail "--json: $out"
import json, sys
d = json.loads(sys.argv[1])
assert d["collective"] == "broadcast" and d["ranks"] == 2, d
assert [r["size_bytes"] for r in d["rows"]] == [8, 64, 512], d
assert all(r["wrong"] == 0 and r["best_us"] <= r["time_us"] for r in d["rows"]), d
PY

# --tune writes a profile of three positive figures that a later run reads.
prof=$(mktemp)
"$run" -n 2 "$bench" --tune "$prof" >/dev/null 2>&1 || fail "--tune failed"
for k in COLLIE_TCP_LATENCY_US COLLIE_TCP_GBPS COLLIE_REDUCE_GBPS; do
  v=$(grep "^$k=" "$prof" | cut -d= -f2)
  awk -v v="$v" 'BEGIN { exit !(v + 0 > 0) }' || fail "--tune wrote $k='$v'"
done
COLLIE_TUNING_FILE=$prof "$run" -n 2 "$bench" -B tcp -b 8 -e 64K -f 64 -n 2 >/dev/null 2>&1 ||
  fail "a run with the --tune profile failed"
rm -f "$prof"
out=$("$run" -n 1 "$bench" --tune /tmp/collie_tune_$$ 2>&1)
grep -q "needs 2 ranks or more" <<<"$out" || fail "--tune at 1 rank: $out"

if command -v gnuplot >/dev/null; then
  png=$(mktemp --suffix=.png)
  "$run" -n 2 "$bench" -b 8 -e 64K -n 2 -w 1 --plot "$png" >/dev/null 2>&1 || fail "--plot run failed"
  [ "$(head -c 4 "$png" | od -An -c | tr -d ' ')" = '211PNG' ] || fail "--plot did not write a PNG"
  rm -f "$png"
else
  echo "gnuplot not installed: --plot not checked"
fi
[ $failures = 0 ] && echo "collie-bench command line: all as expected"
exit $((failures > 0))
