"""Runs a test's command with TMPDIR set to a folder of its own, and fails
it when anything is left in that folder after the command (and every
process it started through it) has exited: a test that leaves its
scratch behind fills a CI machine's /tmp run after run.

    python3 tests/leaves_nothing.py [--allow GLOB]... COMMAND [ARGS...]
    python3 tests/leaves_nothing.py --self-test

The command's exit status is kept (77, meson's skip, included); a clean
run that left files exits 1 naming them. The folder is removed either way.
What others leave on purpose or by their own bug is named, not hidden: a
top-level entry matching an --allow GLOB is not counted, and neither is
PyTorch's compile cache (torchinductor_<user>/, made at import on 2.x and
reused by every later run, so not growing).
"""
import fnmatch
import os
import shutil
import subprocess
import sys
import tempfile


ALWAYS_ALLOWED = ["torchinductor_*"]


def left_in(folder, allow=()):
    """What is under `folder`, as paths relative to it (folders end in /),
    less the top-level entries matching a glob of `allow`."""
    out = []
    for name in os.listdir(folder):
        if any(fnmatch.fnmatch(name, g) for g in list(allow) + ALWAYS_ALLOWED):
            continue
        path = os.path.join(folder, name)
        if not os.path.isdir(path) or os.path.islink(path):
            out.append(name)
            continue
        out += _walk(path, name)
    return sorted(out)


def _walk(top, rel_top):
    out = [rel_top + "/"]
    for root, dirs, files in os.walk(top):
        rel = os.path.join(rel_top, os.path.relpath(root, top))
        out += [os.path.normpath(os.path.join(rel, d)) + "/" for d in dirs]
        out += [os.path.normpath(os.path.join(rel, f)) for f in files]
    return sorted(out)


def main(argv):
    allow = []
    while len(argv) >= 2 and argv[0] == "--allow":
        allow.append(argv[1])
        argv = argv[2:]
    if not argv:
        sys.exit("usage: leaves_nothing.py [--allow GLOB]... COMMAND [ARGS...]")
    folder = tempfile.mkdtemp(prefix="collie-test-tmp-")
    try:
        rc = subprocess.call(argv, env=dict(os.environ, TMPDIR=folder))
        left = left_in(folder, allow)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if rc == 0 and left:
        shown = ", ".join(left[:10]) + (f" and {len(left) - 10} more" if len(left) > 10 else "")
        print(f"FAIL: the test passed but left {len(left)} entries in its TMPDIR: {shown}",
              flush=True)
        return 1
    return rc


def self_test():
    """A run that leaves a folder fails naming it; one that removes what it
    made, or leaves only what --allow names, passes; a failing command's
    status is kept; a skip stays a skip."""
    me = [sys.executable, os.path.abspath(__file__)]
    py = [sys.executable, "-c"]
    leave = "import tempfile; tempfile.mkdtemp(prefix='left-')"
    cases = [
        ([], leave, 1, "left 1 entries in its TMPDIR: left-"),
        (["--allow", "left-*"], leave, 0, None),
        ([], "import shutil, tempfile; shutil.rmtree(tempfile.mkdtemp())", 0, None),
        ([], leave + "; raise SystemExit(3)", 3, None),
        ([], "raise SystemExit(77)", 77, None),
    ]
    bad = 0
    for allow, code, want_rc, want_said in cases:
        run = subprocess.run(me + allow + py + [code], capture_output=True, text=True)
        ok = run.returncode == want_rc and (want_said is None or want_said in run.stdout)
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {allow} {code!r}: exit {run.returncode} "
              f"(want {want_rc}) {run.stdout.strip()}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(self_test() if sys.argv[1:] == ["--self-test"] else main(sys.argv[1:]))
