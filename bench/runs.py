"""bench/runs.py: reading the tables collie-bench and the peers under
bench/peers/ print, for bench/compare.sh and bench/hosts_compare.sh."""
import glob
import statistics


def load(pattern):
    """Per size, over every file matching `pattern`: the median of the time
    column (us) and the sum of the #wrong column (the last). Rows may carry
    collie-run's "[0]" prefix; other lines are skipped."""
    rows = {}
    for path in glob.glob(pattern):
        for line in open(path):
            f = line.split()
            if f and f[0] == "[0]":
                f = f[1:]
            if len(f) >= 8 and f[0].isdigit():
                rows.setdefault(int(f[0]), []).append((float(f[4]), int(f[-1])))
    return {s: (statistics.median(t for t, _ in v), sum(w for _, w in v)) for s, v in rows.items()}


def allreduce_busbw(size, us, ranks):
    """GB/s each rank's link carries in an all-reduce of `size` bytes."""
    return size / us / 1e3 * 2 * (ranks - 1) / ranks


def size_label(s):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if s >= k:
            return f"{s // k} {unit}"
    return f"{s} B"
