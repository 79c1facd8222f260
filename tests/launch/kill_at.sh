# shellcheck shell=bash
# tests/launch/kill_at.sh: sourced by the two-host fault scripts
# (netns_restarts.sh, netns_elastic.sh) that kill a rank mid-run.
#
# kill_at OUT STEP MATCH RANK [--first]: once OUT holds rank 0's line for
# STEP ("[0] step STEP ..."), SIGKILL the process whose command line matches
# MATCH (pgrep -f: a path under the test's own folder tells its processes
# from any other job's) and that collie-run started as rank RANK
# (COLLIE_RANK); with --first, only one that never joined (no COLLIE_JOIN=1:
# not a replacement). Says "killed [the first ]rank RANK (pid P) at step
# STEP"; returns 1 after a FAILED line when the step or the rank never came.
kill_at() {
  local out=$1 step=$2 match=$3 rank=$4 first=${5:-} pid env
  for _ in $(seq 1200); do
    grep -Eq "^\[0\] step +$step " "$out" && break
    sleep 0.05
  done
  grep -Eq "^\[0\] step +$step " "$out" || { echo "FAILED: step $step never came"; return 1; }
  for pid in $(pgrep -f "$match"); do
    env=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null)
    grep -qx "COLLIE_RANK=$rank" <<<"$env" || continue
    if [ "$first" = --first ]; then
      grep -qx 'COLLIE_JOIN=1' <<<"$env" && continue
      kill -9 "$pid" && echo "killed the first rank $rank (pid $pid) at step $step" && return 0
    else
      kill -9 "$pid" && echo "killed rank $rank (pid $pid) at step $step" && return 0
    fi
  done
  echo "FAILED: rank $rank not found"
  return 1
}
