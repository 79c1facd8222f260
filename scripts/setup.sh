#!/usr/bin/env bash
# Installs what collie builds and tests with, from Debian's packages, then
# (scripts/setup_python.sh; COLLIE_SETUP_PYPI=0 skips it) the PyTorches and
# Lightnings from PyPI that the python suite runs against. When
# another apt holds the package locks (an unattended upgrade, say), it waits
# for them, up to 10 minutes, instead of failing.
set -euo pipefail
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
wait_s=${SETUP_LOCK_WAIT:-600}
packages=(
  g++ meson ninja-build pkg-config python3 clang-format              # the build, the format check
  python3-venv                                                       # the PyPI PyTorches' environments
  libgtest-dev libbenchmark-dev                                      # tests, kernel benchmarks
  libhwloc-dev libopenblas-dev libopenmpi-dev openmpi-bin            # topology, PowerSGD, MPI
  gnuplot-nox                                                        # collie-bench --plot
  libgloo-dev                                                        # the Gloo peer in bench/peers/
  libssl-dev                                                         # libcrypto: the handshakes' HMAC-SHA256
  libxxhash-dev                                                      # XXH3: the reducer's replica check
  python3-torch libtorch-dev                                         # collie.torch, torchrun, PyTorch's DDP; the libtorch example
  slurmctld slurmd slurm-client munge                                # the srun test's one-node SLURM
  clang libclang-rt-14-dev                                           # the fuzz targets: clang's libFuzzer (scripts/fuzz.sh)
  iproute2                                                           # ip netns, tc: the two-host and network-fault tests
  ccache                                                             # a compiler cache: Meson uses it when installed
)

# DPkg::Lock::Timeout makes install wait for the dpkg lock, but update takes
# the package lists' lock, which that option does not cover: wait for it here.
update() {
  local out start=$SECONDS said=0
  while ! out=$($SUDO apt-get -o DPkg::Lock::Timeout="$wait_s" update -qq 2>&1); do
    if ! grep -qi "lock" <<<"$out" || (( SECONDS - start >= wait_s )); then
      echo "$out" >&2
      return 1
    fi
    if (( !said )); then
      echo "setup: another apt holds the package lists; waiting for it (up to ${wait_s} s)"
      said=1
    fi
    sleep 2
  done
}

echo "setup: refreshing Debian's package lists"
update
echo "setup: installing ${#packages[@]} packages and what they need (a few hundred, about 300 MB" \
     "on a bare machine, mostly PyTorch), waiting for any other apt to finish"
$SUDO apt-get -o DPkg::Lock::Timeout="$wait_s" install -y -qq --no-install-recommends \
  "${packages[@]}" >/dev/null
# PyPI's newest PyTorch and Lightning, and the oldest Lightning supported,
# for the python suite (scripts/setup_python.sh).
if [ "${COLLIE_SETUP_PYPI:-1}" != 0 ]; then
  "$(dirname "$0")/setup_python.sh"
fi
echo "setup: done"
