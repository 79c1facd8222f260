#!/usr/bin/env bash
# scripts/setup.sh waits for another apt instead of failing on its locks:
# hold the package lists' lock and the dpkg frontend lock for a few seconds
# (fcntl locks, as apt takes them), run setup.sh, and expect it to say it is
# waiting and then succeed. Needs root and a reachable Debian mirror; skips
# (77) with the reason otherwise.
set -uo pipefail
root=$1
[ "$(id -u)" = 0 ] || { echo "skipped: needs root to hold apt's locks"; exit 77; }
command -v apt-get >/dev/null || { echo "skipped: no apt-get"; exit 77; }
apt-get update -qq >/dev/null 2>&1 || { echo "skipped: apt-get update fails without any lock held (no mirror?)"; exit 77; }
hold() {
  python3 -c 'import fcntl, sys, time
f = open(sys.argv[1], "a"); fcntl.lockf(f, fcntl.LOCK_EX)
open(sys.argv[3], "w").close(); time.sleep(float(sys.argv[2]))' "$@"
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
hold /var/lib/apt/lists/lock 4 "$tmp/lists" &
hold /var/lib/dpkg/lock-frontend 8 "$tmp/dpkg" &
for _ in $(seq 100); do [ -e "$tmp/lists" ] && [ -e "$tmp/dpkg" ] && break; sleep 0.05; done
out=$(SETUP_LOCK_WAIT=60 "$root/scripts/setup.sh" 2>&1); rc=$?
wait
echo "$out"
[ $rc = 0 ] || { echo "FAILED: setup.sh exited $rc while another apt held the locks"; exit 1; }
grep -q "waiting for it" <<<"$out" || { echo "FAILED: setup.sh did not say it was waiting"; exit 1; }
echo "setup.sh waited for the locks and succeeded"
