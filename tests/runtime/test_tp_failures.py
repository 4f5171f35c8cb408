"""``tp_plans.failures``, the rule the matrix of ``test_tp_plans.py`` holds each case to, on recorded errors:
fp32 within 1e-5 of PyTorch; bf16 within PyTorch's own rounding of the case (a sum in another order rounds
apart on each small tensor), a wrong gradient not."""

from __future__ import annotations

from dataclasses import asdict

from tp_plans import Case, failures

GEMMA_BF16 = {
    "<output>": (0.0104, 0.0108),
    "layers.0.input_layernorm.weight": (0.0232, 0.00924),
    "layers.0.self_attn.q_proj.weight": (0.0106, 0.007),
    "layers.0.self_attn.k_norm.weight": (0.006, 0.0057),
    "layers.0.mlp.down_proj.weight": (0.0148, 0.0146),
    "layers.1.self_attn.q_norm.weight": (0.0217, 0.0388),
    "layers.1.pre_feedforward_layernorm.weight": (0.0272, 0.023),
    "head.weight": (0.0104, 0.0106),
}
"""Rank 1 of 4, Gemma, sequence parallel, ficco's styles under ``shard/sm``, bf16, batch 1 (errors against the
fp32 run: ficco's, PyTorch's); the same case in fp32 agrees with PyTorch within 1e-6 on every rank."""


def _result(case: Case, errors: dict) -> dict:
    return {"case": asdict(case), "errors": errors, "placements": {}, "spread": {}}


def test_a_bf16_case_passes_within_pytorchs_own_rounding():
    case = Case(model="gemma", batch=1, dtype="bf16")
    assert failures(_result(case, GEMMA_BF16)) == []


def test_a_wrong_bf16_gradient_fails():
    case = Case(model="gemma", batch=1, dtype="bf16")
    missing_a_rank = GEMMA_BF16 | {"layers.0.input_layernorm.weight": (0.5, 0.00924)}
    (bad,) = failures(_result(case, missing_a_rank))
    assert bad == "layers.0.input_layernorm.weight 0.5 (PyTorch's 0.00924)"
    off_by_a_tenth = GEMMA_BF16 | {"head.weight": (0.1, 0.0106)}
    assert len(failures(_result(case, off_by_a_tenth))) == 1


def test_fp32_holds_to_its_tolerance_whatever_pytorch_rounds():
    case = Case(model="gemma", batch=1)
    assert failures(_result(case, {"head.weight": (9e-6, 0.0)})) == []
    assert failures(_result(case, {"head.weight": (2e-5, 0.0), "<output>": (1e-7, 0.0)})) == [
        "head.weight 2e-05 (PyTorch's 0)"
    ]
