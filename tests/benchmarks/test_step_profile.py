"""The GPU profile's split of a step (``benchmarks/step_profile.py``) on made-up kernel timelines: each
kind's union over streams, the GPU's idle time, the communication no compute ran beside."""

from __future__ import annotations

import math

import pytest

from benchmarks.step_profile import KINDS, dominant, kind_of, split


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "comm"),
        ("Memcpy PtoP (Device -> Device)", "comm"),
        ("Memcpy DtoD (Device -> Device)", "copy"),
        ("Memset (Device)", "copy"),
        ("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_TNT", "gemm"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
        ("triton_tem_fused_mm_0", "gemm"),
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>", "attention"),
        ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
        ("triton_poi_fused_add_mul_silu_3", "other"),
        ("void at::native::elementwise_kernel<128, 2>", "other"),
    ],
)
def test_kernels_are_told_apart_by_name(name, kind):
    assert kind_of(name) == kind


def test_split_takes_each_kind_once_over_streams_and_the_rest_as_idle():
    activity = [
        ("gemm_a", 0.0, 400.0),  # us; two GEMMs on two streams overlapping by 100 us
        ("gemm_b", 300.0, 600.0),
        ("ncclDevKernel_ReduceScatter", 500.0, 900.0),  # 100 us beside a GEMM, 300 alone
        ("Memcpy DtoD (Device -> Device)", 950.0, 1000.0),
        ("triton_poi_fused_add_0", 1100.0, 1200.0),
    ]
    got = split(activity, step_ms=1.5)
    assert set(got["kinds"]) == set(KINDS)
    assert math.isclose(got["kinds"]["gemm"], 0.6) and math.isclose(got["kinds"]["comm"], 0.4)
    assert math.isclose(got["kinds"]["copy"], 0.05) and math.isclose(got["kinds"]["other"], 0.1)
    assert math.isclose(got["busy_ms"], 0.6 + 0.3 + 0.05 + 0.1)
    assert math.isclose(got["idle_ms"], 1.5 - got["busy_ms"])
    assert math.isclose(got["exposed_comm_ms"], 0.3) and got["kernels"] == 5
    assert dominant(got) == "gemm"
    assert dominant(split(activity, step_ms=5.0)) == "host"  # the GPU idle most of the step


def test_communication_beside_compute_is_hidden():
    activity = [("gemm", 0.0, 1000.0), ("nccl_a", 100.0, 200.0), ("nccl_b", 900.0, 1100.0)]
    got = split(activity, step_ms=1.1)
    assert math.isclose(got["exposed_comm_ms"], 0.1) and got["idle_ms"] == pytest.approx(0.0, abs=1e-12)


def test_the_gpu_work_sums_each_kernel_once_whatever_overlapped_and_leaves_the_copy_engines_apart():
    activity = [
        ("gemm_a", 0.0, 400.0),  # two GEMMs overlapping by 100 us: 700 us of work in 600 us
        ("gemm_b", 300.0, 600.0),
        ("Memcpy DtoD (Device -> Device)", 500.0, 700.0),  # a copy engine's, beside them
        ("triton_poi_fused_add_0", 800.0, 850.0),
    ]
    got = split(activity, step_ms=1.0)
    assert math.isclose(got["kernel_ms"], 0.7 + 0.05)
    assert math.isclose(got["work_ms"]["gemm"], 0.7) and math.isclose(got["work_ms"]["copy"], 0.2)
    assert math.isclose(got["kinds"]["gemm"], 0.6)  # the union: time, not work
