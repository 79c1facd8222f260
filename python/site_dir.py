"""Prints where `meson install` puts the collie package for a prefix, so
that this interpreter imports it with no PYTHONPATH: the user site when the
prefix is the user base (~/.local), a dist-packages folder of the prefix
when it is on sys.path (Debian's /usr/local), else the prefix's
lib/pythonX.Y/site-packages (add that to PYTHONPATH).

    python3 site_dir.py PREFIX
"""
import os
import site
import sys

prefix = os.path.realpath(os.path.expanduser(sys.argv[1]))
version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
if os.path.realpath(site.getuserbase()) == prefix:
    print(site.getusersitepackages())
else:
    candidates = [os.path.join(prefix, "lib", version, "dist-packages"),
                  os.path.join(prefix, "lib", "python3", "dist-packages"),
                  os.path.join(prefix, "lib", version, "site-packages")]
    on_path = [c for c in candidates if c in map(os.path.realpath, sys.path)]
    print(on_path[0] if on_path else candidates[-1])
