"""The Ascend NPU launchers of rope, run under the Triton interpreter on CPU
tensors with simulated Ascend profiles (one with a UB small enough to split
the heads into several blocks), and PrivateUse1 dispatch."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from csrc_free_ops import device
from csrc_free_ops.rope import RopeOptions, launch, plan, reference
from tests.helpers import ALL_DTYPES, FLOAT_DTYPES, assert_close_to_ref, poison_like, simulate_ascend
from tests.privateuse1_backend import scenario_output
from tests.rope_cases import (
    HEAD_LAYOUTS,
    TABLE_LAYOUTS,
    angle_table,
    make_heads,
    make_table,
    reference_outputs_and_grads,
    reference_variant_grads,
)
from tests.test_rope_variants import build_variant, variants

# A UB this small holds one or a few heads per block.
SMALL_UB = 2048
# (profile, UB override)
PROFILES = [("Ascend910B4", None), ("Ascend910B1", None), ("Ascend910B2", SMALL_UB)]

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="NPU launchers are exercised on CPU tensors")


@pytest.fixture(params=PROFILES, ids=lambda p: f"{p[0]}-ub{p[1] or 'default'}")
def ascend(request, monkeypatch):
    return simulate_ascend(monkeypatch, *request.param)


def _inputs(batch, n_qh, n_kh, seq, dim, rot, dtype, q_layout="transposed", k_layout="contiguous", table="BSR",
            table_dtype=None):  # fmt: skip
    q = make_heads(batch, n_qh, seq, dim, dtype, q_layout, "cpu")
    k = make_heads(batch, n_kh, seq, dim, dtype, k_layout, "cpu")
    cos, sin = (make_table(batch, seq, rot, table_dtype or dtype, table, "cpu") for _ in range(2))
    return q, k, cos, sin


def _plan(q, k, cos, sin, copy_pass):
    problem = launch.problem(q, k, cos, sin, copy_pass)
    return plan.npu(problem, device.npu_ub_bytes(), device.npu_vector_cores())


def _check_all_launchers(q, k, cos, sin):
    dtype = q.dtype
    dq_out, dk_out = torch.randn_like(q), torch.randn_like(k)
    (q_ref, k_ref), (dq_ref, dk_ref) = reference_outputs_and_grads(q, k, cos, sin, dq_out, dk_out)
    q_out, k_out = launch.npu_forward(q, k, cos, sin)
    dq, dk = launch.npu_backward(dq_out, dk_out, cos, sin)
    assert_close_to_ref(q_out, q_ref, dtype, "q_out")
    assert_close_to_ref(k_out, k_ref, dtype, "k_out")
    assert_close_to_ref(dq, dq_ref, dtype, "dq")
    assert_close_to_ref(dk, dk_ref, dtype, "dk")
    assert q_out.stride() == torch.empty_like(q).stride()
    q_in, k_in = q.clone(), k.clone()
    launch.npu_forward_(q_in, k_in, cos, sin)
    assert_close_to_ref(q_in, q_ref, dtype, "q (in place)")
    assert_close_to_ref(k_in, k_ref, dtype, "k (in place)")


CASES = [
    # batch, n_qh, n_kh, seq, dim, rot
    (2, 6, 2, 5, 92, 92),  # GQA, head_dim not a power of two
    (1, 2, 7, 9, 92, 32),  # more kv heads than q heads, partial rotary
    (2, 8, 1, 3, 128, 128),  # MQA
    (1, 5, 5, 4, 18, 6),
]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize(("batch", "n_qh", "n_kh", "seq", "dim", "rot"), CASES)
def test_npu_launchers_match_reference(ascend, dtype, batch, n_qh, n_kh, seq, dim, rot):
    _check_all_launchers(*_inputs(batch, n_qh, n_kh, seq, dim, rot, dtype))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_small_ub_splits_heads_into_several_blocks(monkeypatch, dtype):
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_PROFILE", "Ascend910B4")
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_UB_BYTES", str(SMALL_UB))
    for dim, rot, n_qh, n_kh in ((32, 32, 7, 5), (92, 60, 6, 3)):
        q, k, cos, sin = _inputs(2, n_qh, n_kh, 3, dim, rot, dtype)
        p = _plan(q, k, cos, sin, copy_pass=rot < dim)
        assert p.block_qh < n_qh and p.block_kh < n_kh, p
        _check_all_launchers(q, k, cos, sin)


def test_partial_rotary_pass_through_is_copied_under_small_ub(monkeypatch):
    """NaN-poisoned outputs: every rotated and pass-through element is written."""
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_UB_BYTES", str(SMALL_UB))
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_VECTOR_CORES", "3")
    q, k, cos, sin = _inputs(2, 5, 3, 4, 92, 20, torch.float16)
    qo, ko = poison_like(q), poison_like(k)
    launch.rotate(q, k, qo, ko, cos, sin, _plan(q, k, cos, sin, copy_pass=True), backward=False)
    q_ref, k_ref = reference.forward(q.double(), k.double(), cos.double(), sin.double())
    assert_close_to_ref(qo, q_ref, torch.float16, "q_out")
    assert_close_to_ref(ko, k_ref, torch.float16, "k_out")


@given(
    batch=st.integers(1, 2),
    n_qh=st.integers(1, 6),
    n_kh=st.integers(1, 6),
    seq=st.integers(1, 6),
    dim=st.sampled_from([2, 10, 16, 46, 92, 96]),
    rot_frac=st.floats(0.0, 1.0),
    dtype=st.sampled_from(ALL_DTYPES),
    table_dtype=st.sampled_from(ALL_DTYPES),
    ub=st.sampled_from([1024, SMALL_UB, 192 * 1024]),
    cores=st.integers(1, 48),
    layouts=st.tuples(st.sampled_from(HEAD_LAYOUTS), st.sampled_from(HEAD_LAYOUTS), st.sampled_from(TABLE_LAYOUTS)),
)
def test_npu_launchers_any_shape_any_budget(
    batch, n_qh, n_kh, seq, dim, rot_frac, dtype, table_dtype, ub, cores, layouts
):
    rot = 2 * max(1, round(rot_frac * dim / 2))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CSRC_FREE_OPS_NPU_UB_BYTES", str(ub))
        mp.setenv("CSRC_FREE_OPS_NPU_VECTOR_CORES", str(cores))
        q, k, cos, sin = _inputs(batch, n_qh, n_kh, seq, dim, rot, dtype, *layouts, table_dtype=table_dtype)
        _check_all_launchers(q, k, cos, sin)
        p = _plan(q, k, cos, sin, copy_pass=rot < dim)
        assert p.programs == min(cores, batch * seq)
        assert p.num_warps is None  # no num_warps / num_stages on the NPU


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize(("dim", "rot"), [(64, 64), (92, 92), (128, 32), (256, 256)])
def test_plan_fits_the_ub(ascend, dtype, dim, rot):
    """Cost model: cos/sin row + head block tiles fit the UB, unless one head alone does not."""
    q, k, cos, sin = _inputs(1, 32, 8, 2, dim, rot, dtype, table_dtype=torch.float32)
    copy_pass = rot < dim
    p = _plan(q, k, cos, sin, copy_pass)
    elem = q.element_size()
    compute = 8 if dtype == torch.float64 else 4
    half_w, pass_w = plan.block_half(rot), plan.block_pass(dim, rot)
    per_head = plan.npu_head_bytes(half_w, pass_w, elem, compute, copy_pass)
    fixed = plan.npu_cos_sin_bytes(half_w, 4, compute)
    for block, heads in ((p.block_qh, 32), (p.block_kh, 8)):
        assert block & (block - 1) == 0 and block <= heads
        assert block == 1 or fixed + block * per_head <= device.npu_ub_bytes()
        if block < heads:  # the next power of two would not have fit
            assert fixed + 2 * block * per_head > device.npu_ub_bytes()


# The largest tile of interleaved pairs (heads x BLOCK_HALF) bishengir fits a 192 KiB UB
# with multi-buffering: 4096 overflows (the Ascend compile check, docs/npu.md).
NPU_MAX_INTERLEAVED_PAIRS = 2048

# (q and k, cos and sin): AMP's float32 tables, tables narrower than the data
DTYPE_PAIRS = [(torch.bfloat16, torch.float32), (torch.float16, torch.float16), (torch.float32, torch.bfloat16)]


@pytest.mark.parametrize(("dtype", "table_dtype"), DTYPE_PAIRS)
@pytest.mark.parametrize("pairs", ["interleaved", "interleaved_to_halves"])
@pytest.mark.parametrize(("dim", "rot"), [(128, 128), (256, 256), (128, 64)])
def test_interleaved_pairs_tiles_fit_bishengirs_ub(pairs, dtype, table_dtype, dim, rot):
    """Stride-2 pairs cost bishengir about twice the halves' UB: the plan's
    head blocks for them stay within what it fits on every 910B profile."""
    with pytest.MonkeyPatch.context() as mp:
        simulate_ascend(mp, "Ascend910B4")
        q, k, cos, sin = _inputs(1, 128, 64, 2, dim, rot, dtype, table_dtype=table_dtype)
        problem = launch.problem(q, k, cos, sin, rot < dim, RopeOptions(pairs=pairs))
        p = plan.npu(problem, device.npu_ub_bytes(), device.npu_vector_cores())
        assert max(p.block_qh, p.block_kh) * plan.block_half(rot) <= NPU_MAX_INTERLEAVED_PAIRS
        halves = plan.npu(launch.problem(q, k, cos, sin, rot < dim), device.npu_ub_bytes(), 40)
        assert p.block_qh * 2 == halves.block_qh  # the halves' tiles are not affected


def test_grid_is_vector_cores_or_rows(ascend):
    q, k, cos, sin = _inputs(2, 4, 4, 100, 16, 16, torch.float32)
    assert _plan(q, k, cos, sin, False).programs == device.npu_vector_cores()
    q, k, cos, sin = _inputs(1, 4, 4, 3, 16, 16, torch.float32)
    assert _plan(q, k, cos, sin, False).programs == 3


def test_npu_kernels_pass_no_warps_or_stages(ascend):
    """triton-ascend ignores num_warps / num_stages: NPU plans carry no launch option."""
    for dim, rot in ((16, 16), (92, 32), (256, 256)):
        q, k, cos, sin = _inputs(2, 8, 2, 3, dim, rot, torch.bfloat16)
        for copy_pass in (False, True):
            assert _plan(q, k, cos, sin, copy_pass).num_warps is None


@settings(max_examples=8)
@given(v=variants(), ub=st.sampled_from([1024, SMALL_UB, 192 * 1024]), cores=st.integers(1, 7))
def test_npu_launchers_every_variant(v, ub, cores):
    """The options of issue 18 on the NPU plan (stride-2 pairs, grid-stride
    rows, UB-sized head blocks): forward, backward and in place against the
    float64 reference."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CSRC_FREE_OPS_NPU_UB_BYTES", str(ub))
        mp.setenv("CSRC_FREE_OPS_NPU_VECTOR_CORES", str(cores))
        q, k, cos, sin, options = build_variant(v, "cpu")
        grads_out = tuple(None if x is None else torch.randn_like(x) for x in (q, k))
        refs, ref_grads = reference_variant_grads(q, k, cos, sin, *grads_out, **options)
        outs = launch.npu_forward(q, k, cos, sin, RopeOptions(**options))
        grads = launch.npu_backward(*grads_out, cos, sin, RopeOptions(**options))
        inplace = tuple(None if x is None else x.clone() for x in (q, k))
        launch.npu_forward_(*inplace, cos, sin, RopeOptions(**options))
        for got, want, what in ((outs, refs, "out"), (grads, ref_grads, "grad"), (inplace, refs, "in place")):
            for g, w in zip(got, want, strict=True):
                assert (g is None) == (w is None)
                if g is not None:
                    assert_close_to_ref(g, w, v["dtype"], what)
        problem = launch.problem(q, k, cos, sin, False, RopeOptions(**options)._replace(pairs="halves"))
        p = plan.npu(problem, ub, cores)
        assert p.programs <= cores and p.num_warps is None and not p.split_pairs
        assert p.block_seqs <= plan.NPU_MAX_SEQS_BLOCK


@pytest.mark.parametrize("pairs", ["interleaved", "interleaved_to_halves"])
def test_npu_stride_two_stores_write_every_rotated_pair(pairs):
    """The NPU plan's stride-2 loads and stores of interleaved pairs, with
    half = 6 of an 8-wide tile (masked) and partial rotary, q and k in
    several head blocks: forward, backward (interleaved outputs) and in place
    against the float64 reference."""
    with pytest.MonkeyPatch.context() as mp:
        simulate_ascend(mp, "Ascend910B4", SMALL_UB)
        q, k, cos, sin = _inputs(2, 5, 3, 4, 20, 12, torch.float32)
        options = {"pairs": pairs}
        dq_out, dk_out = torch.randn_like(q), torch.randn_like(k)
        refs, ref_grads = reference_variant_grads(q, k, cos, sin, dq_out, dk_out, **options)
        outs = launch.npu_forward(q, k, cos, sin, RopeOptions(**options))
        grads = launch.npu_backward(dq_out, dk_out, cos, sin, RopeOptions(**options))
        inplace = (q.clone(), k.clone())
        launch.npu_forward_(*inplace, cos, sin, RopeOptions(**options))
        assert _plan(q, k, cos, sin, True).block_qh < q.shape[1]
        for got, want, what in ((outs, refs, "out"), (grads, ref_grads, "grad"), (inplace, refs, "in place")):
            for g, w in zip(got, want, strict=True):
                assert_close_to_ref(g, w, torch.float32, what)


# --- PrivateUse1 dispatch (runs in a subprocess: the backend rename is once per process)


def dispatch_scenario() -> None:
    import registrations  # noqa: F401
    from csrc_free_ops.rope import launch as launch_mod
    from tests import privateuse1_backend as backend

    backend.install()
    calls: list[str] = []
    for name in ("forward", "backward", "forward_"):
        backend.spy_on(launch_mod, name, calls)
    backend.spy_on(plan, "npu", calls, passthrough=True)
    q, k, cos, sin = _inputs(2, 4, 2, 5, 12, 8, torch.float32)
    dq_out, dk_out = torch.randn_like(q), torch.randn_like(k)
    leaves = [backend.to_npu(t).requires_grad_() for t in (q, k)]
    outs = torch.ops.liger.rope(*leaves, backend.to_npu(cos), backend.to_npu(sin))
    grads = torch.autograd.grad(outs, leaves, (backend.to_npu(dq_out), backend.to_npu(dk_out)))
    refs, grad_refs = reference_outputs_and_grads(q, k, cos, sin, dq_out, dk_out)
    q_in, k_in = backend.to_npu(q.clone()), backend.to_npu(k.clone())
    torch.ops.liger.rope_(q_in, k_in, backend.to_npu(cos), backend.to_npu(sin))
    # k alone, packed tokens, positions looked up in the kernel, interleaved pairs
    packed_k, dk_packed = torch.randn(6, 2, 8), torch.randn(6, 2, 8)
    table_cos, table_sin = angle_table(4, 8, torch.float32, "interleaved", "cpu")
    options = {"position_ids": torch.tensor([0, 1, 2, 0, 1, 3]), "pairs": "interleaved"}
    leaf = backend.to_npu(packed_k).requires_grad_()
    npu_options = {**options, "position_ids": backend.to_npu(options["position_ids"])}
    k_out, no_k = torch.ops.liger.rope(leaf, None, backend.to_npu(table_cos), backend.to_npu(table_sin), **npu_options)
    (dk_in,) = torch.autograd.grad(k_out, leaf, backend.to_npu(dk_packed))
    (k_ref, _), (dk_ref, _) = reference_variant_grads(packed_k, None, table_cos, table_sin, dk_packed, None, **options)
    got = (*outs, *grads, q_in, k_in, k_out, dk_in)
    want = (*refs, *grad_refs, *refs, k_ref, dk_ref)
    errors = [((a.cpu().double() - b).norm() / b.norm()).item() for a, b in zip(got, want, strict=True)]
    devices = [str(t.device) for t in got]
    print(json.dumps({"devices": devices, "calls": calls, "errors": errors, "no_k": no_k is None}))


def test_privateuse1_dispatch_reaches_npu_launchers():
    out = json.loads(scenario_output("tests.test_rope_npu").strip().splitlines()[-1])
    assert out["devices"] == ["npu:0"] * 8 and out["no_k"]
    steps = ("forward", "backward", "forward_", "forward", "backward")
    assert out["calls"] == [f"csrc_free_ops.rope.{room}" for step in steps for room in ("plan.npu", f"launch.{step}")]
    assert all(e < 1e-5 for e in out["errors"]), out["errors"]
