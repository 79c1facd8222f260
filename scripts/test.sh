#!/usr/bin/env bash
# Builds collie in BUILD (default build/) and runs its test suite; the last
# line is "N passed, N failed", counted from meson's test log.
#   scripts/test.sh                  release build, every test
#   BUILD=build-asan SANITIZE=address,undefined scripts/test.sh
#   SUITE=mp scripts/test.sh                      (one suite)
#   NO_SUITE=soak scripts/test.sh                 (all but one suite; soak,source: two)
#   MESON_ARGS=-Dmpi=disabled scripts/test.sh    (extra options for meson)
#   TESTS="faults store" scripts/test.sh          (those tests only, and only
#                                    what they need built: CI's TSan run
#                                    takes tests/tsan_tests.txt's list)
#   BUILD_ONLY=1 scripts/test.sh     (builds what the run would need, runs
#                                    nothing: CI builds the sanitizer legs
#                                    ahead, on CPU the release tests leave)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
SANITIZE=${SANITIZE:-none}
args=(-Dbuildtype=release)
# The sanitizer builds: -O1 with line tables only (-g1: a report still
# names each frame's function, file and line), and a unity build. Against
# -O2 -g and one translation unit per file, the ASan build went from 6.6 to
# 2.7 minutes on CI's 2 cores, most of it from -O1 -g1 (the tests' big
# gtest files), and the tests run about as fast.
if [ "$SANITIZE" != none ]; then
  args=(-Dbuildtype=plain -Doptimization=1 -Dunity=on -Db_sanitize="$SANITIZE"
        -Db_lundef=false "-Dcpp_args=-fno-sanitize-recover=all -g1" -Dbenchmarks=false)
fi
# shellcheck disable=SC2206 # MESON_ARGS is a list of options, split on spaces
args+=(${MESON_ARGS:-})
# With TESTS, the library and collie-run first (with build.sh's progress),
# then meson test builds what the chosen tests need and nothing else.
if [ -n "${TESTS:-}" ]; then export BUILD_TARGETS=comm/launch/collie-run; fi
scripts/build.sh "$BUILD" "${args[@]}" || { echo "0 passed, 1 failed"; exit 1; }
if [ -n "${BUILD_ONLY:-}" ]; then
  [ -z "${TESTS:-}" ] && exit 0
  # What the chosen tests run (meson's introspection: each test's targets),
  # as meson test would build it before running them.
  # shellcheck disable=SC2086 # TESTS is a list of test names, split on spaces
  mapfile -t needed < <(python3 - "$BUILD" ${TESTS} <<'PY'
import json, os, subprocess, sys
build, names = sys.argv[1], set(sys.argv[2:])
ask = lambda what: json.loads(subprocess.check_output(["meson", "introspect", build, what]))
files = {t["id"]: t["filename"] for t in ask("--targets")}
for test in ask("--tests"):
    if test["name"] in names:
        for dep in test["depends"]:
            for f in files.get(dep, []):
                print(os.path.relpath(f, os.path.abspath(build)))
PY
)
  log=$(ninja -C "$BUILD" "${needed[@]}" 2>&1) ||
    { echo "$log" | grep -v '^\[' | tail -60; echo "0 passed, 1 failed"; exit 1; }
  exit 0
fi
# OpenSSL's lifetime state is not collie's leak (scripts/lsan.supp).
case $SANITIZE in *address*)
  export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}" ;;
esac
rm -f "$BUILD/failed-tests.txt"
suite_args=()
[ -n "${SUITE:-}" ] && suite_args=(--suite "$SUITE")
for s in ${NO_SUITE:+${NO_SUITE//,/ }}; do suite_args+=(--no-suite "$s"); done
# shellcheck disable=SC2206 # TESTS is a list of test names, split on spaces
[ -n "${TESTS:-}" ] && suite_args+=(${TESTS})
meson test -C "$BUILD" --print-errorlogs "${suite_args[@]}" 2>&1 | tail -n 60
python3 - "$BUILD/meson-logs/testlog.json" <<'PY'
import json, os, sys
passed = failed = skipped = 0
tails = []  # the end of each failed test's output, for CI's last lines
for line in open(sys.argv[1]):
    t = json.loads(line)
    r = t["result"]
    if r in ("OK", "EXPECTEDFAIL"): passed += 1
    elif r == "SKIP": skipped += 1
    else:
        failed += 1
        # meson keeps a test's stderr apart from its stdout: both, the
        # last 20 lines of each
        out = []
        for stream in ("stdout", "stderr"):
            lines = (t.get(stream) or "").rstrip().splitlines()[-20:]
            if lines: out += [f"[{stream}]"] + lines
        tails.append(f"--- {t['name']}: {r}, its last lines\n" + "\n".join(out) + "\n")
with open(os.path.join(os.path.dirname(sys.argv[1]), "..", "failed-tests.txt"), "w") as f:
    f.writelines(tails)
print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
sys.exit(1 if failed or passed == 0 else 0)
PY
