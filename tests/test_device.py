"""One device resolution (training/inference/device.py) for training, evaluation, the index and the service."""
import pytest
import torch

from training.inference.device import resolve_device


@pytest.mark.parametrize("cuda", [False, True])
def test_auto_is_the_gpu_when_there_is_one(monkeypatch, cuda):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert resolve_device("auto") == torch.device("cuda" if cuda else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_a_cuda_device_without_cuda_is_refused(monkeypatch, name):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=f"device '{name}' asked for but no CUDA device is available"):
        resolve_device(name)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device(name) == torch.device(name)


def test_an_unknown_device_name_is_a_clear_error():
    with pytest.raises(RuntimeError, match="gpu"):
        resolve_device("gpu")
