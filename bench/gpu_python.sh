#!/usr/bin/env bash
# The Python checks on the GPU machine's own PyTorch and Lightning (a third
# PyTorch beside CI's 1.13 and PyPI's newest), with the build that
# bench/gpu_bundle.sh carried there, and NCCL opened from PyTorch's wheel:
# collie.torch on CUDA tensors, the DDP tutorial, the API check, the
# Lightning check, and collie-bench over NCCL on one rank. Logs in $OUT.
#   bench/gpu_python.sh          (from the repository root, on the GPU machine)
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT" /tmp/cb
tar -C /tmp/cb -xJf .gpu/bundle.tar.xz || exit 1
B=/tmp/cb/build
nccl=$(find /usr/local /opt /usr/lib -name libnccl.so.2 2>/dev/null | head -1)
cudart=$(find /usr/local /opt /usr/lib -name libcudart.so.13 2>/dev/null | head -1)
export LD_LIBRARY_PATH="/tmp/cb/lib:$(dirname "$cudart"):$B:${LD_LIBRARY_PATH:-}:/tmp/cb/fallback"
export COLLIE_LIBRARY=$B/libcollie.so.0 PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 COLLIE_TIMEOUT=120
step() { echo; echo "=== $*"; }
python3 -c 'import torch, lightning; print("torch", torch.__version__, "lightning", lightning.__version__)'
echo "NCCL of the machine: $nccl"; ldd $B/libcollie.so.0 | grep -c nccl
step "collie-bench nccl, 1 rank (NCCL opened at first use; COLLIE_NCCL_LIBRARY=$nccl)"
COLLIE_NCCL_LIBRARY=$nccl timeout 100 $B/comm/launch/collie-run -n 1 $B/bench/collie-bench -D cuda -B nccl -b 8 -e 64M -f 8 -n 3 -c 1 2>&1 | tail -7
step "test_gpu, 2 ranks, NCCL through the loader's path"
LD_LIBRARY_PATH="$(dirname "$nccl"):$LD_LIBRARY_PATH" timeout 150 $B/comm/launch/collie-run -n 2 $B/tests/test_gpu 2>&1 | grep -E "PASSED|FAILED|Failure" | head
step "collie.torch on CUDA, 2 ranks (NCCL: PyTorch's, already in the process)"
timeout 150 $B/comm/launch/collie-run -n 2 python3 tests/python/cuda_ddp_check.py 2>&1 | tee $OUT/cuda_ddp.log | tail -3
step "the DDP tutorial, 2 and 3 ranks"
timeout 150 python3 tests/python/ddp_tutorial.py 2 3 2>&1 | grep -E "^ok|^FAIL|passed" | tee $OUT/tutorial.log
step "the API check, 2 ranks"
timeout 150 $B/comm/launch/collie-run -n 2 python3 tests/python/torch_api_check.py 2>&1 | grep -E "^\[0\].*(ok |FAIL|passed)" | cut -c1-160 | tee $OUT/api.log
step "Lightning"
timeout 200 python3 tests/python/lightning_check.py 2>&1 | grep -E "\] (ok|FAIL)|passed" | grep -v "rank 1" | cut -c1-160 | tee $OUT/lightning.log
echo "=== done"
