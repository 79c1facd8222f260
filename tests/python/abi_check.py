"""collie's Python package against a library of another release.

  abi_check.py OLDER_STUB SAME_VERSION_STUB

Each stub (tests/abi/old_library.c) exports collie_abi_version alone. The
package must refuse the older one by its version (naming both versions,
not the first call it lacks), and a library that claims the package's
version but lacks its calls by the missing name; and load the real library
(COLLIE_LIBRARY) and report its version as the package's. Each load is
in a fresh interpreter, since _lib loads once.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(HERE, "..", "..", "python")


def load(library):
    env = dict(os.environ, COLLIE_LIBRARY=library,
               PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = ("import collie._lib as l; "
            "print('loaded', l.lib.collie_abi_version(), l.ABI_VERSION)")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout + p.stderr


def main():
    older, same = sys.argv[1], sys.argv[2]
    failures = []

    rc, out = load(os.environ["COLLIE_LIBRARY"])
    fields = out.split()
    if rc != 0 or fields[:1] != ["loaded"] or fields[1] != fields[2]:
        failures.append(f"the real library: rc {rc}, {out.strip()!r}")
    package_abi = int(fields[2]) if rc == 0 and len(fields) >= 3 else None

    rc, out = load(older)
    if package_abi is not None and not (
            rc != 0 and "ImportError" in out and
            f"has ABI {package_abi - 1}; this package needs {package_abi} or later" in out):
        failures.append(f"an older library: rc {rc}, {out.strip()[-400:]!r}")

    rc, out = load(same)
    if not (rc != 0 and "ImportError" in out and "but has no collie_" in out):
        failures.append(f"a library lacking the calls: rc {rc}, {out.strip()[-400:]!r}")

    for f in failures:
        print("FAILED:", f)
    print("abi_check:", "FAILED" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
