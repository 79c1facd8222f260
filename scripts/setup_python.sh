#!/usr/bin/env bash
# Installs, from PyPI, the PyTorches and Lightnings the python suite runs
# collie.torch and collie.lightning against, each in a virtual environment
# of its own: .venv/torch-latest and .venv/torch-oldest (ignored by git),
# from python/requirements/. Debian's python3-torch 1.13 (scripts/setup.sh)
# is the third. PyPI's torch for Linux is a CUDA build (about 3 GB with its
# nvidia wheels each), which runs on a machine without a GPU.
# The environments are made once per machine and requirements, under
# ~/.cache/collie/venvs/ (COLLIE_VENV_CACHE), and .venv/<name> links to
# them: another clone on the same machine (CI's) finds them made.
#   scripts/setup_python.sh                 (scripts/setup.sh runs it)
#   COLLIE_SETUP_PYPI=0 scripts/setup.sh     (Debian's packages only)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${COLLIE_VENV_PYTHON:-python3}
cache=${COLLIE_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/collie/venvs}
mkdir -p .venv "$cache"
for name in torch-latest torch-oldest; do
  req=python/requirements/$name.txt
  venv=$cache/$name-$(sha256sum "$req" | cut -c1-12)
  if [ -x "$venv/bin/python3" ] && [ -f "$venv/.complete" ]; then
    echo "setup: $name is made ($(grep -v '^#' "$req" | tr '\n' ' ')in $venv)"
  else
    echo "setup: installing $(grep -v '^#' "$req" | tr '\n' ' ')into $venv from PyPI (about" \
         "3 GB on a bare machine; 1 to 4 minutes)"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check -r "$req"
    touch "$venv/.complete"
  fi
  rm -rf ".venv/$name"
  ln -s "$venv" ".venv/$name"
done
# The module that gives PyTorch's own DDP collie's memory for its buckets
# (python/collie/_comm_memory.py), built here once per PyTorch that can use
# it (about 20 s), not by the first job that needs it.
for name in torch-latest torch-oldest; do
  ".venv/$name/bin/python3" - python/collie/_comm_memory.py <<'PY'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("comm_memory", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
if m.supported():
    try:
        m.build()
        print(f"setup: collie's DDP memory module is built for PyTorch {m.torch.__version__}")
    except Exception as e:  # optional: DDP's buckets then stay in PyTorch's memory
        print(f"setup: warning: collie's DDP memory module could not be built: {e}")
PY
done
