"""One pool of compute threads per process (training/inference/threads.py): numpy's and FAISS's BLAS pools get one
thread where the model runs, torch keeps its own, and a stopped service puts them back."""
import asyncio

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_limits

from conftest import serve_app
from service.app import create_app
from service.settings import Settings
from training.inference.threads import TORCH_LIBRARIES, blas_pools, single_threaded_blas


def _threads() -> dict[str, int]:
    return {pool["filepath"]: pool["num_threads"] for pool in blas_pools()}


def test_numpy_and_faiss_blas_get_one_thread_and_torch_keeps_its_own():
    import faiss  # noqa: F401 - its OpenBLAS is one of the pools

    torch_threads = torch.get_num_threads()
    with threadpool_limits(limits=3, user_api="blas"):
        before = _threads()
        restore = single_threaded_blas()
        try:
            during = _threads()
            assert any("numpy" in path for path in during), during           # numpy's OpenBLAS is seen ...
            assert any("faiss" in path for path in during), during           # ... and faiss-cpu's
            assert not any(lib in path for path in during for lib in TORCH_LIBRARIES)
            assert set(during.values()) == {1}
            assert torch.get_num_threads() == torch_threads
            a = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
            assert np.allclose(a @ a.T, (a.astype(np.float64) @ a.T.astype(np.float64)), atol=1e-3)
        finally:
            restore()
        assert _threads() == before == {path: 3 for path in before}


def test_the_service_runs_with_one_blas_thread_and_restores_them_when_it_stops(tiny_model_path, tiny_index_dir):
    with threadpool_limits(limits=2, user_api="blas"):
        app = create_app(Settings(model=str(tiny_model_path), index=str(tiny_index_dir), reload_interval_s=0))

        async def work(client):
            r = await client.post("/v1/search/images", json={"text": "a red square", "k": 2})
            assert r.status_code == 200, r.text
            return _threads()

        during = asyncio.run(serve_app(app, work))
        assert during and set(during.values()) == {1}
        assert set(_threads().values()) == {2}


@pytest.mark.parametrize("library", TORCH_LIBRARIES)
def test_a_pool_in_torchs_own_library_is_not_one_of_them(monkeypatch, library):
    import training.inference.threads as threads

    fake = {"user_api": "blas", "filepath": f"/x/site-packages{library}libtorch_cpu.so", "num_threads": 4}
    monkeypatch.setattr(threads, "threadpool_info", lambda: [fake])
    assert threads.blas_pools() == []
