#!/usr/bin/env python3
"""The repository's documents stand alone: no tracked file points at a path
above the repository, every relative markdown link resolves inside it, and
every path a document names in backticks that starts with one of the
repository's top-level folders (`bench/RESULTS.md`, `comm/front/front.cc`) exists.
Prints what is wrong and exits 1; 77 (skipped) outside a git checkout.

  check_docs.py [REPO_ROOT]
"""
import os
import re
import subprocess
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
try:
    files = subprocess.run(["git", "-C", root, "ls-files"], check=True, capture_output=True,
                           text=True).stdout.split()
except (OSError, subprocess.CalledProcessError):
    print("not a git checkout: skipped")
    sys.exit(77)

top = {f.split("/")[0] for f in files if "/" in f}
problems = []
LINK = re.compile(r"\]\(([^)\s]+)\)")
TICK = re.compile(r"`([^`\s]+)`")
PLACEHOLDER = re.compile(r"[<>*{}$~|]|\.\.\.|N\.log")
for f in files:
    path = os.path.join(root, f)
    if not os.path.isfile(path):
        continue
    try:
        text = open(path, encoding="utf-8").read()
    except (UnicodeDecodeError, OSError):
        continue
    for n, line in enumerate(text.splitlines(), 1):
        if "../shared" in line and f != "scripts/check_docs.py":
            problems.append(f"{f}:{n}: points outside the repository: {line.strip()}")
    if not f.endswith(".md"):
        continue
    in_code = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            t = os.path.normpath(os.path.join(os.path.dirname(path), target.split("#")[0]))
            if not t.startswith(root + os.sep) and t != root:
                problems.append(f"{f}:{n}: link leaves the repository: {target}")
            elif not os.path.exists(t):
                problems.append(f"{f}:{n}: link to a missing file: {target}")
        for token in TICK.findall(line):
            token = token.rstrip(".,:;")
            if "/" not in token or token.split("/")[0] not in top or PLACEHOLDER.search(token):
                continue
            if not os.path.exists(os.path.join(root, token.split("#")[0].split(":")[0])):
                problems.append(f"{f}:{n}: names a path that does not exist: {token}")
print("\n".join(problems) if problems else f"{len([f for f in files if f.endswith('.md')])} documents stand alone")
sys.exit(1 if problems else 0)
