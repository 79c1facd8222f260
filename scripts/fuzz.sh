#!/usr/bin/env bash
# Builds the fuzz targets of tests/fuzz/ with clang's libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer (in build-fuzz/, only what
# the targets need) and runs each for SECONDS, two at a time, from its seeds
# and regression inputs. A target passes when it ran its time without a
# finding (a crash, a sanitizer report, a leak, a broken contract, an input
# slower than FUZZ_INPUT_SECONDS, 10 by default); the last line is
# "N passed, N failed", as scripts/test.sh ends. What a target finds is kept in build-fuzz/fuzz-out/<name>/ with the
# command that replays it. Without clang it says so and passes nothing.
#   scripts/fuzz.sh [SECONDS]        (default 60; CI runs it)
#   FUZZ_TARGETS="frame hook_spec" FUZZ_JOBS=2 scripts/fuzz.sh 600
#   FUZZ_KEEP=1 scripts/fuzz.sh 600  (go on from the inputs the last run found)
#   FUZZ_BUILD_ONLY=1 scripts/fuzz.sh (builds the targets, runs nothing)
#   FUZZ_INPUT_SECONDS=30 scripts/fuzz.sh (an input slower than this is a
#                                    finding; default 10. CI runs the
#                                    targets beside its sanitizer tests, at
#                                    the lowest priority, and allows 30)
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
build=${FUZZ_BUILD:-build-fuzz}
jobs=${FUZZ_JOBS:-2}
if ! command -v clang++ >/dev/null || ! command -v clang >/dev/null; then
  echo "fuzz: clang is not installed (scripts/setup.sh installs it): the fuzz targets are skipped"
  echo "0 passed, 0 failed"
  exit 0
fi
targets=${FUZZ_TARGETS:-$(sed -n "s/^  '\([a-z0-9_]*\)',.*/\1/p" tests/fuzz/meson.build)}
if [ -z "$targets" ]; then
  echo "fuzz: no targets found in tests/fuzz/meson.build"
  echo "0 passed, 1 failed"
  exit 1
fi
n_targets=$(echo "$targets" | wc -w)

# The library with the targets' instrumentation, and the targets; nothing
# else of the project (no tests, benchmarks, CUDA or MPI).
if [ ! -f "$build/build.ninja" ]; then
  echo "fuzz: configuring $build/ with clang"
  log=$(CXX=clang++ CC=clang meson setup "$build" -Dfuzz=true -Dtests=false -Dbenchmarks=false \
    -Dcuda=disabled -Dmpi=disabled -Dbuildtype=debugoptimized -Db_sanitize=address,undefined \
    -Db_lundef=false -Dwerror=false -Dcpp_args=-fno-sanitize-recover=all 2>&1) ||
    { echo "$log" | tail -30; echo "fuzz: meson setup failed"; echo "0 passed, $n_targets failed"; exit 1; }
fi
echo "fuzz: building $n_targets targets"
ninja_targets=()
for t in $targets; do ninja_targets+=("tests/fuzz/fuzz_$t"); done
if ! log=$(ninja -C "$build" -j "$jobs" "${ninja_targets[@]}" 2>&1); then
  echo "$log" | grep -v '^\[' | tail -40
  echo "fuzz: the build failed"
  echo "0 passed, $n_targets failed"
  exit 1
fi
if [ -n "${FUZZ_BUILD_ONLY:-}" ]; then
  echo "fuzz: $n_targets targets built"
  exit 0
fi

# One target: SECONDS of fuzzing into a fresh working corpus (the seeds and
# regression inputs stay as they are), its log and any finding in OUT.
run_one() {
  local t=$1 out="$build/fuzz-out/$1"
  if [ -n "${FUZZ_KEEP:-}" ]; then
    rm -f "$out"/crash-* "$out"/leak-* "$out"/timeout-* "$out"/oom-* "$out/rc"
  else
    rm -rf "$out"
  fi
  mkdir -p "$out/corpus"
  local dirs=("tests/fuzz/corpus/$t")
  [ -d "tests/fuzz/regressions/$t" ] && dirs+=("tests/fuzz/regressions/$t")
  # The CPU time it took (user and system), for the record of how long each
  # target has been fuzzed (docs/fuzzing.md).
  local TIMEFORMAT='%U %S'
  { time "$build/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout="$input_seconds" -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$out/" "$out/corpus" "${dirs[@]}" >"$out/log" 2>&1; } \
    2>"$out/cpu"
  echo $? >"$out/rc"
}
export -f run_one
input_seconds=${FUZZ_INPUT_SECONDS:-10}
export build seconds input_seconds FUZZ_KEEP
echo "fuzz: $n_targets targets, ${seconds} s each, $jobs at a time"
# shellcheck disable=SC2086 # the target names are words
printf '%s\n' $targets | xargs -P "$jobs" -I{} bash -c 'run_one {}'

passed=0
failed=0
for t in $targets; do
  out="$build/fuzz-out/$t"
  rc=$(cat "$out/rc" 2>/dev/null || echo 1)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/log")
  cpu=$(awk '{ printf "%.0f", $1 + $2 }' "$out/cpu" 2>/dev/null)
  if [ "$rc" = 0 ]; then
    passed=$((passed + 1))
    echo "fuzz_$t: passed (${runs:-?} inputs in ${seconds} s, ${cpu:-?} s of CPU," \
      "$(find "$out/corpus" -type f | wc -l) new in $out/corpus)"
  else
    failed=$((failed + 1))
    echo "fuzz_$t: FAILED (exit $rc); its log, $out/log, ends:"
    grep -E 'fuzz finding|ERROR: |SUMMARY|runtime error|Test unit written' "$out/log" | head -8 | sed 's/^/  /'
    for a in "$out"/crash-* "$out"/leak-* "$out"/timeout-* "$out"/oom-*; do
      [ -f "$a" ] && echo "  replay: $build/tests/fuzz/fuzz_$t $a"
    done
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
