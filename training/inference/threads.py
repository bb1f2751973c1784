"""One pool of compute threads per process: torch's.

A process that runs the model also runs small numpy and FAISS products between its forward passes (the relevance
of every hit, index/relevance.py; FAISS's exact search of a batch). numpy and faiss-cpu each bring their own
OpenBLAS, each with a thread per core, and an OpenBLAS thread keeps spinning on its core for a while after every
product it took part in, waiting for the next. Those spinning threads then compete with torch's threads for the
same cores during the next forward pass: the text search at batch 64, with torch on both of 2 cores, ran 1.6 times
as slowly as with one thread in each pool (docs/benchmarks.md, "BLAS threads"). :func:`single_threaded_blas` gives
every such pool one thread: its products are small (a batch of queries against a few thousand vectors), and the
cores stay with torch's pool, which does the work that needs them. torch's own BLAS (built into its library,
driven by torch's threads) is not one of them and keeps its threads.
"""
from __future__ import annotations

import logging
from typing import Callable

# imported with the module, not when first called: a service may drop its privileges after its imports (a replica
# run as another user), and the packages may then no longer be readable
from threadpoolctl import ThreadpoolController, threadpool_info

log = logging.getLogger("jointspace")

# a pool in one of these libraries is torch's own: never limited
TORCH_LIBRARIES = ("/torch/lib/", "\\torch\\lib\\")


def _not_torch(filepath: str) -> bool:
    return not any(lib in filepath for lib in TORCH_LIBRARIES)


def blas_pools() -> list[dict]:
    """The BLAS libraries loaded in this process other than torch's, as ``threadpoolctl`` describes them
    (``filepath``, ``internal_api``, ``num_threads``, …)."""
    return [pool for pool in threadpool_info()
            if pool["user_api"] == "blas" and _not_torch(pool["filepath"])]


def single_threaded_blas() -> Callable[[], None]:
    """Sets every BLAS pool loaded in this process except torch's (numpy's OpenBLAS, faiss-cpu's) to one thread
    (see the module). Only the libraries loaded by then are seen: call it once the index code (which imports numpy
    and FAISS) is imported, where a process that runs the model starts. Returns what puts each pool's thread count
    back as it was (a service that stops inside a longer-lived process, as in the tests)."""
    pools = [lib for lib in ThreadpoolController().lib_controllers
             if lib.user_api == "blas" and _not_torch(lib.filepath)]
    before = [(lib, lib.num_threads) for lib in pools]
    for lib in pools:
        lib.set_num_threads(1)
    log.debug("BLAS pools set to one thread: %s", ", ".join(lib.filepath for lib in pools) or "none")

    def restore() -> None:
        for lib, threads in before:
            lib.set_num_threads(threads)
    return restore
