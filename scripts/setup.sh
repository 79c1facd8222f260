#!/usr/bin/env bash
# Installs what collie builds and tests with, from Debian's packages.
set -euo pipefail
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  g++ meson ninja-build pkg-config python3 clang-format \
  libgtest-dev libbenchmark-dev libhwloc-dev libopenblas-dev libopenmpi-dev openmpi-bin >/dev/null
