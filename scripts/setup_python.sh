#!/usr/bin/env bash
# Installs, from PyPI, the PyTorches and Lightnings the python suite runs
# collie.torch and collie.lightning against, each in a virtual environment
# of its own under .venv/ (ignored by git): torch-latest and torch-oldest,
# from python/requirements/. Debian's python3-torch 1.13 (scripts/setup.sh)
# is the third. PyPI's torch for Linux is a CUDA build (about 3 GB with its
# nvidia wheels each; pip's cache makes a second install quick), which runs
# on a machine without a GPU. An environment whose requirements have not
# changed since it was made is kept.
#   scripts/setup_python.sh                 (scripts/setup.sh runs it)
#   COLLIE_SETUP_PYPI=0 scripts/setup.sh     (Debian's packages only)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${COLLIE_VENV_PYTHON:-python3}
for name in torch-latest torch-oldest; do
  req=python/requirements/$name.txt
  venv=.venv/$name
  if [ -x "$venv/bin/python3" ] && cmp -s "$req" "$venv/requirements.txt"; then
    echo "setup: $venv is up to date ($(grep -v '^#' "$req" | tr '\n' ' '))"
    continue
  fi
  echo "setup: installing $(grep -v '^#' "$req" | tr '\n' ' ')into $venv from PyPI (about 3 GB" \
       "on a bare machine; 1 to 4 minutes)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check -r "$req"
  cp "$req" "$venv/requirements.txt"
done
