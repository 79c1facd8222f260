"""Builds bench/c10d_ext/process_group.cc against the running PyTorch
(torch.utils.cpp_extension, once per PyTorch under build/c10d_ext/) and
registers it as the torch.distributed backend "collie_cpp": the C++ form of
the collie backend, for the benchmarks' comparison with the Python one
(--cpp in bench/torch_ddp_bench.py and bench/torch_backend_latency.py)."""
import os

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_comms = []  # the communicators under the groups made (their C++ backends hold raw handles)


def register():
    from torch.utils.cpp_extension import load

    from collie._lib import _find_library
    from collie._torch_world import connect_through_torch

    lib = os.path.realpath(_find_library())
    build = os.path.join(ROOT, "build", "c10d_ext", torch.__version__.replace("+", "_"))
    os.makedirs(build, exist_ok=True)
    ext = load(name="collie_c10d", sources=[os.path.join(ROOT, "bench", "c10d_ext",
                                                         "process_group.cc")],
               extra_include_paths=[os.path.join(ROOT, "include")],
               extra_ldflags=[lib, f"-Wl,-rpath,{os.path.dirname(lib)}"],
               extra_cflags=["-O2"], build_directory=build, verbose=False)

    def create(store, rank, size, timeout):
        comm = connect_through_torch(store=store, rank=rank, size=size)
        _comms.append(comm)
        return ext.make(comm._h.value, rank, size)

    dist.Backend.register_backend("collie_cpp", create, devices=["cpu"])
