"""The SM carve-out and BLAS-library settings restore what they found (CPU: torch's BLAS preference and the
device's SM count are stood in for; the carve-out setting itself is torch's own)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ficco.executor.resources import SMCarveout, blas_library


@pytest.fixture
def fake_cuda(monkeypatch):
    """A 132-SM device and a BLAS preference that, like torch's, returns the new value when set."""
    state = {"library": "cublas"}

    def preferred_blas_library(name=None):
        if name is not None:
            state["library"] = name
        return state["library"]

    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", preferred_blas_library)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132)
    )
    torch._C._set_sm_carveout_experimental(None)
    yield state
    torch._C._set_sm_carveout_experimental(None)


def test_carveout_sets_both_inside_and_restores_both_after_every_use(fake_cuda):
    carve = SMCarveout(torch.device("cuda", 0), 16)
    for _ in range(2):  # reusable
        with carve:
            assert torch._C._get_sm_carveout_experimental() == 16 and fake_cuda["library"] == "cublaslt"
        assert torch._C._get_sm_carveout_experimental() is None and fake_cuda["library"] == "cublas"
    with pytest.raises(RuntimeError), carve:
        raise RuntimeError("a GEMM failed")
    assert torch._C._get_sm_carveout_experimental() is None and fake_cuda["library"] == "cublas"


def test_blas_library_restores_the_preference_it_found(fake_cuda):
    fake_cuda["library"] = "default"
    with blas_library("cublaslt"):
        assert fake_cuda["library"] == "cublaslt"
        with blas_library("cublas"):
            assert fake_cuda["library"] == "cublas"
        assert fake_cuda["library"] == "cublaslt"
    assert fake_cuda["library"] == "default"


@pytest.mark.parametrize("sms", [0, 132, 200])
def test_a_carveout_that_leaves_no_sm_or_takes_none_is_refused(fake_cuda, sms):
    with pytest.raises(ValueError, match=rf"of the 132 SMs of cuda:0: 0 < carveout < 132; got {sms}"):
        SMCarveout(torch.device("cuda", 0), sms)
