#!/usr/bin/env python3
"""A check of the project's shell scripts for a pipeline that fails by
chance: under `set -o pipefail`, `producer | grep -q PATTERN` is false
whenever grep quits at its first match while the producer is still
writing (the producer dies of SIGPIPE, and pipefail reports that), so a
match can be reported missing, more often the longer the output and the
busier the machine (netns_elastic_train_mlp_2x2 failed so on
2026-12-05). Search a variable or a file instead: `grep -q P <<<"$out"`,
`grep -q P file`. Prints each such pipeline and exits 1 if there is one.

  check_shell.py [REPO_ROOT]   the repository (default: this script's)
  check_shell.py --self-test   runs the check on made-up scripts and fails
                               unless it finds exactly the bad pipelines
"""
import os
import re
import subprocess
import sys
import tempfile

# A pipe (not `||`), maybe a line break after it, then grep with q among
# its short options (or --quiet / --silent) before the next command.
QUIET_GREP = re.compile(r"(?<!\|)\|(?!\|)[ \t]*(?:\\?\n[ \t]*)*(?:e|f)?grep\b"
                        r"[^|;&\n]*?[ \t](?:-[A-Za-z]*q[A-Za-z]*|--quiet|--silent)\b")
PIPEFAIL = re.compile(r"^[^#\n]*\bset\b[^#\n]*(?:-o[ \t]+pipefail|-[A-Za-z]*o[ \t]+pipefail)",
                      re.M)


def shell_files(root):
    """The tracked files that are shell scripts: *.sh, or a shell on the
    first line."""
    out = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True,
                         check=True).stdout.split()
    found = []
    for rel in out:
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            continue
        if rel.endswith(".sh"):
            found.append(rel)
            continue
        try:
            with open(path, "rb") as f:
                first = f.readline()
        except OSError:
            continue
        if re.match(rb"#!.*\b(ba|da|z)?sh\b", first):
            found.append(rel)
    return found


def bad_pipelines(text):
    """(line, excerpt) of each pipeline into a quiet grep, in a script that
    sets pipefail; comments are left out."""
    if not PIPEFAIL.search(text):
        return []
    code = "\n".join("" if line.lstrip().startswith("#") else line for line in text.split("\n"))
    return [(code.count("\n", 0, m.start()) + 1, " ".join(m.group(0).split()))
            for m in QUIET_GREP.finditer(code)]


def check(root, files):
    bad = []
    for rel in files:
        with open(os.path.join(root, rel), errors="replace") as f:
            bad += ["%s:%d: %s" % (rel, line, what) for line, what in bad_pipelines(f.read())]
    return bad


def self_test():
    scripts = {
        "a.sh": "#!/bin/bash\nset -euo pipefail\n"
                "sed -n 1,9p f |\n  grep -Eq 'x' || echo no\n"   # bad (2 lines)
                "echo \"$out\" | grep -q y\n"                     # bad
                "grep -q z <<<\"$out\"\n"                         # fine
                "true || grep -q w f\n"                           # fine: ||, not a pipe
                "# cat f | grep -q v\n"                           # fine: a comment
                "cat f | grep -c u\n"                             # fine: grep reads it all
                "cat f | grep -s u\n",                            # fine: -s is not quiet
        "b.sh": "#!/bin/bash\nset -u\ncat f | grep -q t\n",     # fine: no pipefail
        "c": "#!/usr/bin/env bash\nset -o pipefail\nls | grep --quiet s\n",  # bad
    }
    with tempfile.TemporaryDirectory() as root:
        for name, text in scripts.items():
            with open(os.path.join(root, name), "w") as f:
                f.write(text)
        subprocess.run(["git", "init", "-q", root], check=True)
        subprocess.run(["git", "-C", root, "add", "."], check=True)
        files = shell_files(root)
        bad = check(root, files)
    want = ["a.sh:3", "a.sh:5", "c:3"]
    got = [b.split(": ")[0] for b in bad]
    if sorted(files) != ["a.sh", "b.sh", "c"] or got != want:
        print("self-test: expected %s in %s, got %s" % (want, ["a.sh", "b.sh", "c"], bad))
        return 1
    print("self-test: the three quiet greps after a pipe were found, nothing else")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))
    files = shell_files(root)
    bad = check(root, files)
    for b in bad:
        print(b)
    if bad:
        print("%d pipelines into a quiet grep under pipefail: search a variable or a file "
              "instead (grep -q P <<<\"$out\")" % len(bad))
        return 1
    print("%d shell scripts: no pipeline into a quiet grep under pipefail" % len(files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
