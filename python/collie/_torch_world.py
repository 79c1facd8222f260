"""collie's communicator of the job torch.distributed has joined.

When a program has called torch.distributed.init_process_group (the DDP
tutorial's mp.spawn + init_process_group(rank=..., world_size=...),
Lightning's launchers, a notebook), the ranks and the world are PyTorch's,
whatever the launcher or init method (env://, tcp://, file://, a Store):
launcher variables may be missing (mp.spawn sets none) or describe a
different job. So collie takes PyTorch's rank and world size, and
rendezvous through PyTorch's own store:

  * every rank writes its host name, so each learns which ranks share its
    host (shm needs that) and its local rank;
  * rank 0 binds a listening socket on a free port (held from then on, so
    nothing can take it), and writes its address, the port and a fresh job
    secret; collie's rank 0 serves its store on that very socket
    (COLLIE_STORE_FD for the one connect), every other rank connects to it.

Nothing extra for the user: no port, no variable. Each communicator made
this way takes the next generation of keys (collie/<n>/...) in PyTorch's
store; the ranks make them in the same order, as with any collective.
"""
import json
import os
import secrets
import socket
import threading

__all__ = ["torch_world", "connect_through_torch"]

_generation = 0
_lock = threading.Lock()


def torch_world(group=None):
    """(rank, world size) of torch.distributed's default group (or
    `group`), or None when torch.distributed is not there or not
    initialised."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        return dist.get_rank(group), dist.get_world_size(group)
    except Exception:  # noqa: BLE001 - a torch without the default group
        return None


def _host_key():
    """What tells this host apart from the job's others: the launcher's node
    number where it gives one (torchrun's GROUP_RANK, collie-run's, SLURM's),
    which also separates hosts that share a name (containers, network
    namespaces), with the host name."""
    node = ""
    for var in ("GROUP_RANK", "COLLIE_NODE_RANK", "SLURM_NODEID"):
        if os.environ.get(var):
            node = f"{var}={os.environ[var]}"
            break
    return f"{socket.gethostname()}/{node}"


def _address_for_peers(store):
    """How ranks on other hosts reach this one (rank 0): the address the
    job already reaches rank 0's PyTorch store on, where there is one."""
    for var in ("MASTER_ADDR", "COLLIE_MASTER_ADDR"):
        if os.environ.get(var):
            return os.environ[var]
    s = store
    for _ in range(4):  # PrefixStore(s) over the TCPStore
        host = getattr(s, "host", None)
        if isinstance(host, str) and host:
            return host
        s = getattr(s, "underlying_store", None)
        if s is None:
            break
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()


def connect_through_torch(backend=None, timeout=None, store=None, rank=None, size=None,
                          deterministic=None):
    """A collie.Communicator of torch.distributed's whole job, rendezvoused
    through PyTorch's store. Collective over PyTorch's ranks. `store`,
    `rank` and `size`: a group's own (what PyTorch hands a backend it
    creates: a PrefixStore of the group, this process's rank in it and its
    size), instead of the default group's."""
    from . import connect

    global _generation
    if store is None:
        import torch.distributed as dist
        rank, size = dist.get_rank(), dist.get_world_size()
        store = dist.distributed_c10d._get_default_store()
        with _lock:
            _generation += 1
            gen = _generation
    else:
        gen = "backend"  # a group's own PrefixStore: its keys are its own
    if size == 1:
        return connect(rank=0, world_size=1, backend=backend, timeout=timeout,
                       deterministic=deterministic)
    key = f"collie/{gen}/"
    host = _host_key()
    store.set(f"{key}host/{rank}", host)
    hosts = [store.get(f"{key}host/{r}").decode() for r in range(size)]
    local = [r for r in range(size) if hosts[r] == host]
    listener = None
    try:
        if rank == 0:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("", 0))
            listener.listen(128)
            addr = _address_for_peers(store)
            store.set(f"{key}rendezvous", json.dumps(
                {"addr": addr, "port": listener.getsockname()[1], "secret": secrets.token_hex(16)}))
        info = json.loads(store.get(f"{key}rendezvous").decode())
        # Every rank on one host: loopback, which every rank's mesh then
        # listens on too; else the address rank 0 gave.
        addr = "127.0.0.1" if len(local) == size else info["addr"]
        opts = dict(rank=rank, world_size=size, master_addr=addr, master_port=info["port"],
                    secret=info["secret"], local_rank=local.index(rank),
                    local_world_size=len(local), backend=backend, timeout=timeout,
                    deterministic=deterministic)
        if listener is None:
            with _rendezvous_env(None):
                return connect(**opts)
        with _rendezvous_env(listener.fileno()):
            try:
                return connect(**opts)
            finally:
                # collie's store server owns the socket from the connect on
                # (and closes it); never closed twice.
                listener.detach()
                listener = None
    finally:
        if listener is not None:
            listener.close()


class _rendezvous_env:
    """The environment of one connect through PyTorch's store: rank 0's
    store serves on the socket bound above (COLLIE_STORE_FD), and the
    variables of collie's own launcher, which point elsewhere (collie-run's
    store, a store file), are set aside."""

    NAMES = ("COLLIE_STORE_FD", "COLLIE_LAUNCHER_STORE", "COLLIE_STORE_FILE", "COLLIE_STORE_PREFIX")

    def __init__(self, fd):
        self.fd = fd

    def __enter__(self):
        self.old = {n: os.environ.pop(n) for n in self.NAMES if n in os.environ}
        if self.fd is not None:
            os.environ["COLLIE_STORE_FD"] = str(self.fd)

    def __exit__(self, *exc):
        for n in self.NAMES:
            os.environ.pop(n, None)
        os.environ.update(self.old)
