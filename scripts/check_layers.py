#!/usr/bin/env python3
"""collie's layers, from the bottom up, and the check that no file includes
from a layer above its own (or from a peer folder of its own layer).
Prints the layer graph (which folder includes which, and how often), then
every upward include, and exits 1 if there is one.

  check_layers.py [REPO_ROOT]   the repository (default: this script's)
  check_layers.py --self-test   runs the check on a made-up tree with one
                                upward and one sideways include, and fails
                                unless both are found

A folder's README says what it is for; docs/architecture.md says why the
layers are these. An include is resolved as the compiler does here: from
the repository's root, from include/, or beside the including file; what
resolves to no file of the repository (system and library headers) is not
the project's and is skipped. collie_build_config.h, written by meson, is
the base layer's.
"""
import os
import re
import sys
import tempfile

# From the bottom up: (layer, its folders). A folder's files are those
# directly in it, not in its subfolders (comm/ is the backend contract;
# comm/tcp/ a backend).
LAYERS = [
    ("public API", ["include/collie"]),
    ("base", ["base"]),
    ("device kernels", ["kernels"]),
    ("sockets", ["comm/net"]),
    ("store", ["comm/store"]),
    ("backend contract", ["comm"]),
    ("algorithms", ["comm/algorithms"]),
    ("backends", ["comm/tcp", "comm/shm", "comm/mpi", "comm/nccl", "comm/cuda", "comm/hier",
                  "comm/fake"]),
    ("front", ["comm/front"]),
    ("launcher", ["comm/launch"]),
    ("gradients", ["buckets", "hooks"]),
    ("reducer", ["reducer"]),
    ("C ABI", ["capi"]),
]
GENERATED = {"collie_build_config.h": "base"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = (".h", ".cc", ".cu", ".c")


def layer_of():
    where = {}
    for i, (name, folders) in enumerate(LAYERS):
        for f in folders:
            where[f] = (i, name)
    return where


def resolve(root, including, target):
    """The repository path `target` names from `including`, or None."""
    for base in (root, os.path.join(root, "include"), os.path.dirname(os.path.join(root, including))):
        p = os.path.normpath(os.path.join(base, target))
        if os.path.isfile(p) and p.startswith(root + os.sep):
            return os.path.relpath(p, root)
    return None


def check(root):
    root = os.path.abspath(root)
    where = layer_of()
    edges, bad = {}, []
    for folder in where:
        d = os.path.join(root, folder)
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            path = os.path.join(folder, name)
            if not name.endswith(SOURCES) or not os.path.isfile(os.path.join(root, path)):
                continue
            text = open(os.path.join(root, path), encoding="utf-8", errors="replace").read()
            for line_no, target in ((text.count("\n", 0, m.start()) + 1, m.group(1))
                                    for m in INCLUDE.finditer(text)):
                to = GENERATED.get(target)
                if to is None:
                    got = resolve(root, path, target)
                    if got is None:
                        continue
                    to = os.path.dirname(got)
                if to == folder:
                    continue
                if to not in where:
                    bad.append(f"{path}:{line_no}: includes {target}, in {to}/, which is in no layer")
                    continue
                edges[(folder, to)] = edges.get((folder, to), 0) + 1
                (mine, my_layer), (theirs, their_layer) = where[folder], where[to]
                if theirs > mine:
                    bad.append(f"{path}:{line_no}: includes {target}: {to}/ is the {their_layer} "
                               f"layer, above {folder}/'s ({my_layer})")
                elif theirs == mine:
                    bad.append(f"{path}:{line_no}: includes {target}: {to}/ is a peer of {folder}/ "
                               f"in the {my_layer} layer (peers do not include each other)")
    return edges, bad


def report(edges, bad):
    for i, (name, folders) in reversed(list(enumerate(LAYERS))):
        print(f"{i:2} {name}")
        for f in folders:
            uses = sorted(((to, n) for (frm, to), n in edges.items() if frm == f),
                          key=lambda e: -layer_of()[e[0]][0])
            print(f"     {f}/" + ("  ->  " + ", ".join(f"{to}/ ({n})" for to, n in uses) if uses else ""))
    for b in bad:
        print(b)
    print(f"{len(bad)} upward or sideways include(s)" if bad else "no upward or sideways include")
    return 1 if bad else 0


def self_test():
    with tempfile.TemporaryDirectory() as t:
        files = {"base/a.h": '#include "collie/x.h"\n#include <vector>\n',
                 "include/collie/x.h": "",
                 "comm/b.h": '#include "base/a.h"\n',
                 "comm/tcp/t.cc": '#include "comm/b.h"\n#include "comm/shm/s.h"\n',
                 "comm/shm/s.h": '#include "comm/front/f.h"\n',
                 "comm/front/f.h": '#include "comm/tcp/t.cc"\n'}
        for p, text in files.items():
            os.makedirs(os.path.join(t, os.path.dirname(p)), exist_ok=True)
            open(os.path.join(t, p), "w").write(text)
        _, bad = check(t)
        found = {b.split(":")[0] for b in bad}
        want = {"comm/tcp/t.cc", "comm/shm/s.h"}
        if found != want:
            print(f"self-test: expected complaints about {sorted(want)}, got {bad}")
            return 1
        print("self-test: the upward and the sideways include were found, nothing else")
        return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    sys.exit(report(*check(root)))
