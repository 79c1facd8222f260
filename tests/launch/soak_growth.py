#!/usr/bin/env python3
"""How the soak (tests/launch/soak.py) reads its samples: one value per
round of a job for each of the launcher's and the ranks' descriptors and
RSS, and whether the ranks' descriptors grew across rounds. Run alone, it
checks itself against samples whose answer is known.

A descriptor that leaks is held from when it leaks to the round's end, so
it is in every sample after it; one held for a moment (the listener a rank
keeps open while its peers connect, under load longer than the soak's
settling time; a checkpoint being written) is not. So a round's count of
descriptors is the fewest of its samples, and only rounds with at least
MIN_FD_SAMPLES samples are judged: one sample cannot tell a moment from a
round. (The CI of 4a51d9e failed on "tcp: rank fds grew from 8 to 9" with
the most common count of two samples, the larger of a tie.)

A sample counts only once every rank holds a socket (it has reached the
job's store): the settling time is a guess, and a round started again under
load can spend it all importing PyTorch. The CI of 30ba1c9 failed on "the
launcher's fds changed across restarts: [23, 15]": every sample of a later
round was taken while its four new ranks held 3 descriptors each, before
any had connected, and the launcher 8 fewer (their store connections).

A rank's RSS climbs for its first seconds as it warms up (a PyTorch rank's
from 460 to 714 MiB in 5 s here, longer under CI's load), so a round whose
samples are still climbing past the growth margin, or that has one sample,
is not judged: the CI of 8da99d6 failed on "tcp: rank RSS grew from 580692
to 739512 KiB", a round of fresh PyTorch ranks sampled while warming up
against a later round of warm ones. A leak per round still shows: each
round settles higher than the first.
"""

METRICS = ("launcher_fds", "rank_fds", "launcher_rss", "rank_rss")
MIN_FD_SAMPLES = 2
MIN_RSS_SAMPLES = 2


def rss_margin(kib):
    """How far a rank's RSS may exceed `kib` (KiB) without counting as
    growth: 10 % or 4 MiB, whichever is more."""
    return max(4096, kib // 10)


def steady(samples):
    """{round: {metric: value}} from samples ({"round", metric...,
    "rank_fd_kinds", "ranks_connected"}, in the order taken; those whose
    ranks had not all connected left out): the fewest descriptors of the
    round's samples (None with fewer than MIN_FD_SAMPLES of them), the
    median RSS (the ranks': None with fewer than MIN_RSS_SAMPLES, or while
    the last exceeds the first by more than rss_margin), and what the
    fewest descriptors were ("rank_fd_kinds")."""
    out = {}
    samples = [x for x in samples if x.get("ranks_connected", True)]
    for rnd in sorted({x["round"] for x in samples}):
        mine = [x for x in samples if x["round"] == rnd]
        v = {}
        for m in METRICS:
            xs = sorted(x[m] for x in mine)
            if m.endswith("fds"):
                v[m] = xs[0] if len(xs) >= MIN_FD_SAMPLES else None
            elif m == "rank_rss":
                first, last = mine[0][m], mine[-1][m]
                settled = len(xs) >= MIN_RSS_SAMPLES and last - first <= rss_margin(first)
                v[m] = xs[len(xs) // 2] if settled else None
            else:
                v[m] = xs[len(xs) // 2]
        v["rank_fd_kinds"] = min(mine, key=lambda x: x["rank_fds"]).get("rank_fd_kinds", {})
        out[rnd] = v
    return out


def fd_growth(rounds, metric="rank_fds"):
    """rounds: [(job, round, steady value)] in order. None if the judged
    rounds' `metric` never exceeds the first judged round's, else (first,
    most): the steady values of that first round and of the round with the
    most."""
    judged = [v for _, _, v in rounds if v[metric] is not None]
    if len(judged) < 2:
        return None
    most = max(judged, key=lambda v: v[metric])
    return None if most[metric] <= judged[0][metric] else (judged[0], most)


def _self_test():
    def sample(rnd, rank_fds, launcher_fds=12):
        return {"round": rnd, "launcher_fds": launcher_fds, "rank_fds": rank_fds,
                "launcher_rss": 1000, "rank_rss": 2000, "rank_fd_kinds": {"socket": rank_fds}}

    # A descriptor open for one of a round's two samples is not the round's.
    st = steady([sample(0, 8), sample(0, 9), sample(1, 9), sample(1, 8)])
    assert st[0]["rank_fds"] == 8 and st[1]["rank_fds"] == 8, st
    assert fd_growth([(0, r, v) for r, v in st.items()]) is None
    # One held for the whole of a later round is growth, and says what.
    st = steady([sample(0, 8), sample(0, 8), sample(1, 9), sample(1, 9), sample(1, 10)])
    grew = fd_growth([(0, r, v) for r, v in st.items()])
    assert grew and grew[0]["rank_fds"] == 8 and grew[1]["rank_fds"] == 9, grew
    assert grew[1]["rank_fd_kinds"] == {"socket": 9}, grew
    # A round of one sample is not judged, as first round or as later one.
    st = steady([sample(0, 9), sample(1, 8), sample(1, 8), sample(2, 9)])
    assert st[0]["rank_fds"] is None and st[2]["rank_fds"] is None, st
    assert fd_growth([(0, r, v) for r, v in st.items()]) is None
    st = steady([sample(0, 8), sample(0, 8), sample(1, 11)])
    assert fd_growth([(0, r, v) for r, v in st.items()]) is None
    # Across jobs: the first judged round of the first job is the baseline.
    a = steady([sample(0, 7), sample(0, 7)])
    b = steady([sample(0, 8), sample(0, 8)])
    grew = fd_growth([(0, 0, a[0]), (1, 0, b[0])])
    assert grew and (grew[0]["rank_fds"], grew[1]["rank_fds"]) == (7, 8), grew
    # The launcher's count is read the same way.
    st = steady([sample(0, 8, 12), sample(0, 8, 13)])
    assert st[0]["launcher_fds"] == 12, st
    # Samples taken before every rank had connected are not the round's:
    # the round whose ranks were still importing is not there at all.
    def early(rnd, launcher_fds):
        return dict(sample(rnd, 3, launcher_fds), ranks_connected=False)
    st = steady([sample(2, 12, 23), sample(2, 12, 23), early(5, 15), early(5, 15)])
    assert list(st) == [2] and st[2]["launcher_fds"] == 23, st
    st = steady([sample(2, 12, 23), sample(2, 12, 23), early(5, 15), sample(5, 12, 23),
                 sample(5, 12, 23)])
    assert st[5]["launcher_fds"] == 23 and st[5]["rank_fds"] == 12, st
    # Ranks' RSS: a round still warming up (or of one sample) is not
    # judged; settled rounds are, and one settled higher is growth.
    def rss(rnd, kib):
        return dict(sample(rnd, 8), rank_rss=kib)
    warm = steady([rss(0, 460000), rss(0, 580000), rss(1, 714000), rss(1, 739000), rss(2, 580000)])
    assert warm[0]["rank_rss"] is None and warm[2]["rank_rss"] is None, warm
    assert warm[1]["rank_rss"] == 739000, warm
    leak = steady([rss(0, 700000), rss(0, 714000), rss(1, 800000), rss(1, 805000)])
    assert (leak[0]["rank_rss"], leak[1]["rank_rss"]) == (714000, 805000), leak
    assert leak[1]["rank_rss"] > leak[0]["rank_rss"] + rss_margin(leak[0]["rank_rss"])
    print("soak_growth: self-test passed")


if __name__ == "__main__":
    _self_test()
