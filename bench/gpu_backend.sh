#!/usr/bin/env bash
# The torch.distributed backend on CUDA tensors, on the lent GPU machine, in
# one call, with the build bench/gpu_bundle.sh carried as .gpu/bundle.tar.xz
# (NCCL and cudart: the machine's own, PyTorch's wheels): the GPU suite and
# collie.torch on CUDA again (regressions since the last lease), then
# tests/python/backend_cuda_check.py for "collie" and for
# "cpu:collie,cuda:nccl" at 2 ranks on the one GPU, and the per-call cost of
# dist.all_reduce on CUDA through each (bench/torch_backend_cuda_latency.py).
# Logs in $OUT.
#   bench/gpu_backend.sh          (from the repository root, on the GPU machine)
set -uo pipefail
. bench/gpu_env.sh
export PYTHONPATH=$PWD/python:$PWD/tests/python COLLIE_TIMEOUT=60
run=$B/comm/launch/collie-run
step() { echo; echo "=== $*"; }
step machine
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, "nccl", torch.cuda.nccl.version())'
step "test_gpu, 1 rank"
timeout 60 $B/tests/test_gpu 2>&1 | tee $OUT/test_gpu_np1.log | grep -E "PASSED|FAILED|Failure" | head
step "test_gpu, 2 ranks"
timeout 90 $run -n 2 $B/tests/test_gpu 2>&1 | tee $OUT/test_gpu_np2.log | grep -E "PASSED|FAILED|Failure" | head
step "collie.torch on CUDA tensors, 2 ranks"
timeout 90 $run -n 2 python3 tests/python/cuda_ddp_check.py 2>&1 | tee $OUT/cuda_ddp.log | tail -3
for b in collie cpu:collie,cuda:nccl; do
  step "the backend on CUDA: init_process_group(\"$b\"), 2 ranks on the GPU"
  timeout 100 $run -n 2 python3 tests/python/backend_cuda_check.py $b 2>&1 | tee $OUT/backend_cuda_${b//[:,]/_}.log | grep -E "ok |FAIL|passed|Error|error" | cut -c1-400 | head -30
done
step "dist.all_reduce on CUDA, 1 rank: collie's own call, the backend, cpu:collie,cuda:nccl, nccl"
timeout 90 $run -n 1 python3 bench/torch_backend_cuda_latency.py 2>&1 | tee $OUT/latency.log | tail -12
step "where an 8 B dist.all_reduce's time goes, on CUDA and on the CPU, 1 rank"
timeout 60 $run -n 1 python3 bench/backend_call_parts.py cuda 2>&1 | tee $OUT/parts_cuda.log | head -5
timeout 60 $run -n 1 python3 bench/backend_call_parts.py cpu 2>&1 | tee $OUT/parts_cpu.log | head -5
step "collie-bench over NCCL, 1 rank, device memory (collie's own path, C++)"
COLLIE_CUDA_BACKEND=nccl timeout 60 $run -n 1 $B/bench/collie-bench -D cuda -B nccl -b 8 -e 16M -f 8 -n 3 2>&1 | tee $OUT/bench_nccl_np1.txt | tail -9
echo; echo "=== done"
