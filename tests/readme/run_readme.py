#!/usr/bin/env python3
"""Runs README.md's "Using it" recipe exactly as written, so it cannot rot.

The part between `<!-- readme-test: begin -->` and `<!-- readme-test: end -->`
is read block by block, in order:
  ```sh              commands, run in one bash session (set -e, pipefail)
  ```c NAME / ```cpp NAME   a file, written as NAME before the commands run
  ```text            lines the output of the `sh` block before it must hold
                     (each as a substring of some output line)
A block after `<!-- readme-test: skip ... -->` is not run (the comment says
why). Everything runs in a fresh copy of the repository's tracked files, with
$HOME an empty folder (but the user's ccache directory) and no
LD_LIBRARY_PATH (meson test sets one), so an install that only works from
the build tree fails here.

  run_readme.py SOURCE_ROOT
Exit 0: every block ran and printed what the README says; 77: skipped (not a
git checkout); 1 otherwise, with the whole log.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^```(\S*)\s*(\S*)\s*$")


def blocks(readme):
    text = open(readme, encoding="utf-8").read()
    begin = text.index("<!-- readme-test: begin -->")
    end = text.index("<!-- readme-test: end -->")
    lines = text[begin:end].splitlines()
    out, skip, i = [], False, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("<!-- readme-test: skip"):
            skip = True
        m = FENCE.match(line)
        if m and m.group(1):
            body = []
            i += 1
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            if not skip:
                out.append((m.group(1), m.group(2), "\n".join(body) + "\n"))
            skip = False
        i += 1
    return out


def main():
    src = os.path.abspath(sys.argv[1])
    try:
        files = subprocess.run(["git", "-C", src, "ls-files", "-z"], check=True,
                               capture_output=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        print("not a git checkout: skipped")
        return 77
    # The launcher lines need torchrun (python3-torch) and mpirun: without
    # them the test says so and skips, except in CI, where setup.sh installs
    # them and their absence is a failure.
    needed = {cmd for kind, _, body in blocks(os.path.join(src, "README.md")) if kind == "sh"
              for cmd in ("torchrun", "mpirun") if re.search(rf"^{cmd} ", body, re.M)}
    missing = sorted(c for c in needed if not shutil.which(c))
    if missing:
        print(f"{', '.join(missing)} not installed (scripts/setup.sh installs them)")
        return 1 if os.environ.get("CI") == "true" else 77
    work = tempfile.mkdtemp(prefix="collie-readme-")
    try:
        repo, home = os.path.join(work, "repo"), os.path.join(work, "home")
        os.makedirs(home)
        for f in filter(None, files):
            if os.path.exists(os.path.join(src, f)):
                os.makedirs(os.path.dirname(os.path.join(repo, f)) or repo, exist_ok=True)
                shutil.copy2(os.path.join(src, f), os.path.join(repo, f))
        script, expected = ["set -eo pipefail"], []
        n = 0
        for kind, name, body in blocks(os.path.join(src, "README.md")):
            if kind == "sh":
                n += 1
                script += [f"echo '@@@ block {n}'", body]
            elif kind == "text":
                expected.append((n, [l for l in body.splitlines() if l.strip()]))
            elif name:
                with open(os.path.join(repo, name), "w", encoding="utf-8") as fh:
                    fh.write(body)
            else:
                print(f"a ```{kind} block without a file name")
                return 1
        env = {k: v for k, v in os.environ.items()
               if k not in ("LD_LIBRARY_PATH", "PKG_CONFIG_PATH") and not k.startswith("COLLIE_")
               and not k.startswith("MESON")}
        env["HOME"] = home
        # The compiler cache stays the user's (where ccache is installed,
        # Meson compiles through it): the same objects, built once.
        if "CCACHE_DIR" not in env and shutil.which("ccache"):
            r = subprocess.run(["ccache", "-k", "cache_dir"], capture_output=True, text=True)
            if r.returncode == 0 and r.stdout.strip():
                env["CCACHE_DIR"] = r.stdout.strip()
        r = subprocess.run(["bash", "-c", "\n".join(script)], cwd=repo, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=1200)
        out = {}
        current = 0
        for line in r.stdout.splitlines():
            m = re.match(r"^@@@ block (\d+)$", line)
            if m:
                current = int(m.group(1))
            else:
                out.setdefault(current, []).append(line)
        problems = []
        if r.returncode != 0:
            problems.append(f"block {current} failed with exit status {r.returncode}")
        for block, want in expected:
            for w in want:
                if not any(w in got for got in out.get(block, [])):
                    problems.append(f"block {block} did not print '{w}'")
        if problems:
            print(r.stdout)
            print("\n".join(problems))
            return 1
        print(f"README 'Using it': {n} command blocks and {len(expected)} outputs as written")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
