"""Fuzzing every op of torch.ops.liger against the float64 references.

Hypothesis draws the call (shapes with size-1, odd and zero sizes, memory
layouts, each tensor's dtype, every option of rope) and a seed for the
values, which are fresh random numbers.  Each example runs the forward op,
autograd through it, the backward op called directly with an incoming
gradient of any dtype, and for rope the in-place rope_, and compares every
output and gradient with the op's reference.py run in float64, within
tests/helpers.py's per-dtype tolerances (NaN or inf never passes).

CI runs a fixed, bounded set of examples (derandomized: the same examples
on every run, so a failure reproduces).  For a longer random search set
LIGER_FUZZ_EXAMPLES, e.g. ``LIGER_FUZZ_EXAMPLES=300 pytest tests/test_fuzz.py``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from csrc_free_ops.glu import reference as glu_reference
from csrc_free_ops.poly_norm import reference as poly_norm_reference
from csrc_free_ops.rope import RopeOptions
from csrc_free_ops.rope import reference as rope_reference
from tests.helpers import (
    ALL_DTYPES,
    DEVICE,
    assert_close_to_ref,
    assert_close_to_scale,
    assert_glu_dgate_close,
    compute_dtype,
)
from tests.rope_cases import reference_variant_grads
from tests.row_norm_cases import assert_matches as assert_row_norm_matches
from tests.test_group_norm import dx_term_scale, param_grad_term_scales
from tests.test_group_norm import reference_grads as group_norm_reference_grads
from tests.test_poly_norm import assert_grads_close as assert_poly_norm_grads_close

_EXAMPLES = os.environ.get("LIGER_FUZZ_EXAMPLES")


def _fuzz(ci_examples: int):
    """Bounded and derandomized for CI; LIGER_FUZZ_EXAMPLES=n: n random examples."""
    return settings(
        max_examples=int(_EXAMPLES) if _EXAMPLES else ci_examples,
        derandomize=not _EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: minutes under the interpreter; draws are printed
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


Rand = Callable[..., torch.Tensor]
LAYOUTS = ("contiguous", "reversed", "sliced", "expanded")


def _random(seed: int) -> Rand:
    """rand(shape, dtype): standard normal values from a generator seeded by hypothesis."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)

    def rand(shape, dtype):
        return torch.randn(tuple(shape), generator=gen, dtype=torch.float32, device=DEVICE).to(dtype)

    return rand


def _make(rand: Rand, shape, dtype, layout: str) -> torch.Tensor:
    """A tensor of ``shape`` with random values in one of LAYOUTS:
    reversed: every dim's stride order reversed (the last dim is not innermost);
    sliced: a view at an offset with the last dim at stride 2 (not dense);
    expanded: dim 0 broadcast (stride 0)."""
    shape = tuple(shape)
    if layout == "contiguous" or not shape:
        return rand(shape, dtype)
    if layout == "reversed":
        return rand(shape[::-1], dtype).permute(*reversed(range(len(shape))))
    if layout == "sliced" and len(shape) == 1:
        return rand((2 * shape[0] + 1,), dtype)[1::2]
    if layout == "sliced":
        base = rand((shape[0] + 1, *shape[1:-1], 2 * shape[-1] + 1), dtype)
        return base[1:, ..., 1::2]
    if layout == "expanded":
        return rand((1, *shape[1:]), dtype).expand(shape)
    raise ValueError(layout)


def _close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    if ref.numel():
        assert_close_to_ref(out, ref, dtype, what)


def _close_to_scale(out, ref, scale, dtype, what, compute) -> None:
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    if ref.numel():
        assert_close_to_scale(out, ref, scale, dtype, what, compute)


def _with_a_zero(draw, sizes: list[int]) -> list[int]:
    """One example in ten gets one of ``sizes`` set to 0."""
    if sizes and draw(st.integers(0, 9)) == 0:
        sizes[draw(st.integers(0, len(sizes) - 1))] = 0
    return sizes


dtypes = st.sampled_from(ALL_DTYPES)
seeds = st.integers(0, 2**31 - 1)


# --- poly_norm, poly_norm_backward


@_fuzz(ci_examples=12)
@given(data=st.data(), seed=seeds)
def test_poly_norm(data, seed):
    draw = data.draw
    lead = _with_a_zero(draw, draw(st.lists(st.integers(1, 3), max_size=3)))
    shape = (*lead, draw(st.integers(1, 40)))
    x_dtype, w_dtype, b_dtype, dy_dtype = (draw(dtypes) for _ in range(4))
    bias_shape = draw(st.sampled_from([(1,), ()]))
    eps = draw(st.sampled_from([1e-6, 1e-5, 1e-2]))
    rand = _random(seed)
    x = _make(rand, shape, x_dtype, draw(st.sampled_from(LAYOUTS))).requires_grad_()
    weight = rand((3,), w_dtype).requires_grad_()
    bias = rand(bias_shape, b_dtype).requires_grad_()
    dy = _make(rand, shape, x_dtype, draw(st.sampled_from(LAYOUTS)))

    y = torch.ops.liger.poly_norm(x, weight, bias, eps)
    y_ref = poly_norm_reference.forward(x.detach().double(), weight.detach().double(), bias.detach().double(), eps)
    assert y.dtype == x_dtype and y.is_contiguous()
    _close(y, y_ref, x_dtype, "y")

    grads = torch.autograd.grad(y, (x, weight, bias), dy)
    assert [g.dtype for g in grads] == [x_dtype, w_dtype, b_dtype] and grads[2].shape == bias.shape
    refs = poly_norm_reference.backward(dy.double(), x.detach().double(), weight.detach().double(), eps)
    _check_poly_norm_grads((grads[0], grads[1], grads[2].reshape(1)), refs, x, weight, dy, eps)

    # The backward op, with an incoming gradient of any dtype (values rounded to it first).
    dy2 = _make(rand, shape, dy_dtype, draw(st.sampled_from(LAYOUTS)))
    direct = torch.ops.liger.poly_norm_backward(dy2, x.detach(), weight.detach(), eps)
    assert [g.dtype for g in direct] == [x_dtype, w_dtype, w_dtype]
    refs = poly_norm_reference.backward(dy2.double(), x.detach().double(), weight.detach().double(), eps)
    _check_poly_norm_grads(direct, refs, x, weight, dy2, eps)


def _check_poly_norm_grads(grads, refs, x, weight, dy, eps) -> None:
    """Each gradient relative to the terms summed into it (test_poly_norm's
    bounds); with no rows, dx is empty and dweight, dbias exactly 0."""
    if x.numel():
        assert_poly_norm_grads_close(grads, refs, x, weight, dy, eps)
        return
    assert grads[0].shape == x.shape
    assert not grads[1].any() and not grads[2].any(), "dweight/dbias of no rows must be 0"


# --- rms_norm, layer_norm and their backward ops (through autograd)

# rms_norm's (offset, casting_mode) conventions: Llama's, Gemma's, OLMo2's.
RMS_CONVENTIONS = ((0.0, "llama"), (1.0, "gemma"), (0.0, "gemma"))


@_fuzz(ci_examples=12)
@given(data=st.data(), seed=seeds)
def test_row_norms(data, seed):
    draw = data.draw
    op = draw(st.sampled_from(["rms_norm", "layer_norm"]))
    lead = _with_a_zero(draw, draw(st.lists(st.integers(1, 3), max_size=3)))
    shape = (*lead, draw(st.integers(1, 40)))
    x_dtype, w_dtype, b_dtype = (draw(dtypes) for _ in range(3))
    has_weight, has_bias = draw(st.booleans()), op == "layer_norm" and draw(st.booleans())
    eps = draw(st.sampled_from([1e-6, 1e-5, 1e-2]))
    rand = _random(seed)
    x = _make(rand, shape, x_dtype, draw(st.sampled_from(LAYOUTS))).requires_grad_()
    weight = rand(shape[-1:], w_dtype).requires_grad_() if has_weight else None
    bias = rand(shape[-1:], b_dtype).requires_grad_() if has_bias else None
    dy = _make(rand, shape, x_dtype, draw(st.sampled_from(LAYOUTS)))
    if op == "rms_norm":
        offset, casting_mode = draw(st.sampled_from(RMS_CONVENTIONS if has_weight else RMS_CONVENTIONS[::2]))
        y = torch.ops.liger.rms_norm(x, weight, eps, offset=offset, casting_mode=casting_mode)
        center, round_normed = False, casting_mode == "llama"
    else:
        y = torch.ops.liger.layer_norm(x, weight, bias, eps)
        offset, center, round_normed = 0.0, True, False
    present = [t for t in (x, weight, bias) if t is not None]
    got = iter(torch.autograd.grad(y, present, dy))
    grads = tuple(None if t is None else next(got) for t in (x, weight, bias))
    if x.numel():
        assert_row_norm_matches(y, grads, x, weight, bias, dy, eps, offset, center, round_normed)
        return
    assert y.shape == x.shape and grads[0].shape == x.shape
    assert all(g is None or not g.any() for g in grads[1:]), "parameter gradients of no rows must be 0"


# --- swiglu, geglu and their backward ops


@_fuzz(ci_examples=12)
@given(data=st.data(), seed=seeds)
def test_glu(data, seed):
    """Elementwise: every output within its dtype's bound of the float64 reference; dgate relative to its
    terms (act'(gate) is a sum that cancels at one gate value)."""
    draw = data.draw
    name, activation = draw(st.sampled_from([("swiglu", "silu"), ("geglu", "gelu_tanh"), ("geglu_exact", "gelu")]))
    shape = tuple(_with_a_zero(draw, [*draw(st.lists(st.integers(1, 3), max_size=3)), draw(st.integers(1, 40))]))
    gate_dtype, up_dtype, dy_dtype = draw(dtypes), draw(dtypes), draw(dtypes)
    rand = _random(seed)
    if draw(st.booleans()) and shape:  # the halves of one fused projection
        proj = _make(rand, (*shape[:-1], 2 * shape[-1]), gate_dtype, draw(st.sampled_from(LAYOUTS)))
        gate, up = proj.chunk(2, -1)
        up = up.to(up_dtype)
    else:
        gate = _make(rand, shape, gate_dtype, draw(st.sampled_from(LAYOUTS)))
        up = _make(rand, shape, up_dtype, draw(st.sampled_from(LAYOUTS)))
    gate, up = gate.detach().requires_grad_(), up.detach().requires_grad_()
    out_dtype = torch.promote_types(gate.dtype, up.dtype)
    dy = _make(rand, shape, out_dtype, draw(st.sampled_from(LAYOUTS)))
    op = getattr(torch.ops.liger, name)

    y = op(gate, up)
    g64, u64 = gate.detach().double(), up.detach().double()
    assert y.dtype == out_dtype and y.is_contiguous()
    _close(y, glu_reference.forward(g64, u64, activation), out_dtype, "y")
    dgate, dup = torch.autograd.grad(y, (gate, up), dy)
    assert (dgate.dtype, dup.dtype) == (gate.dtype, up.dtype)
    refs = glu_reference.backward(dy.double(), g64, u64, activation)
    if dgate.numel():  # dgate cancels where act'(gate) does: bounded by its terms
        assert_glu_dgate_close(dgate, refs[0], activation, gate, up, dy)
    _close(dup, refs[1], up.dtype, "dup")

    # The backward op, with an incoming gradient of any dtype (values rounded to it first).
    dy2 = _make(rand, shape, dy_dtype, draw(st.sampled_from(LAYOUTS)))
    direct = getattr(torch.ops.liger, name + "_backward")(dy2, gate.detach(), up.detach())
    refs = glu_reference.backward(dy2.double(), g64, u64, activation)
    if dgate.numel():
        assert_glu_dgate_close(direct[0], refs[0], activation, gate, up, dy2, "dgate (backward op)")
    _close(direct[1], refs[1], up.dtype, "dup (backward op)")


# --- group_norm, group_norm_backward


@_fuzz(ci_examples=12)
@given(data=st.data(), seed=seeds)
def test_group_norm(data, seed):
    draw = data.draw
    groups, per_group = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sizes = _with_a_zero(draw, [draw(st.integers(1, 3)), per_group, *draw(st.lists(st.integers(1, 4), max_size=2))])
    shape = (sizes[0], groups * sizes[1], *sizes[2:])
    channels = shape[1]
    x_dtype, dy_dtype = draw(dtypes), draw(dtypes)
    eps = draw(st.sampled_from([1e-5, 1e-6, 1e-1]))
    rand = _random(seed)
    x = _make(rand, shape, x_dtype, draw(st.sampled_from(LAYOUTS))).requires_grad_()
    weight, bias = (rand((channels,), draw(dtypes)).requires_grad_() if draw(st.booleans()) else None for _ in "wb")
    dy = _make(rand, shape, x_dtype, draw(st.sampled_from(LAYOUTS)))

    y = torch.ops.liger.group_norm(x, groups, weight, bias, eps)
    assert y.dtype == x_dtype and y.is_contiguous()
    leaves = {"x": x, "weight": weight, "bias": bias}
    leaves = {name: t for name, t in leaves.items() if t is not None}
    grads = dict(zip(leaves, torch.autograd.grad(y, list(leaves.values()), dy), strict=True))
    y_ref, grads_ref = group_norm_reference_grads(x, groups, weight, bias, dy, eps)
    _close(y, y_ref, x_dtype, "y")
    _check_group_norm_grads(grads, grads_ref, x, groups, weight, bias, dy, eps)

    # The backward op, with an incoming gradient of any dtype.
    dy2 = _make(rand, shape, dy_dtype, draw(st.sampled_from(LAYOUTS)))
    dx, dweight, dbias = torch.ops.liger.group_norm_backward(
        dy2, x.detach(), groups, _detach(weight), _detach(bias), eps
    )
    assert (dweight is None) == (weight is None) and (dbias is None) == (bias is None)
    direct = {"x": dx, "weight": dweight, "bias": dbias}
    _, grads_ref = group_norm_reference_grads(x, groups, weight, bias, dy2, eps)
    _check_group_norm_grads({k: v for k, v in direct.items() if v is not None}, grads_ref, x, groups, weight, bias,
                            dy2, eps)  # fmt: skip


def _detach(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()


def _check_group_norm_grads(grads, grads_ref, x, groups, weight, bias, dy, eps) -> None:
    """dx relative to its terms (it cancels in small groups: dx_term_scale),
    dweight and dbias relative to the terms of their sums over N x spatial."""
    assert set(grads) == set(grads_ref)
    if not x.numel():  # nothing to normalize (the scales below need a non-empty x)
        assert grads["x"].shape == x.shape
        assert all(not g.any() for name, g in grads.items() if name != "x"), "dweight/dbias of an empty x must be 0"
        return
    compute = compute_dtype(x.dtype)
    w = weight if weight is not None else torch.ones(x.shape[1], dtype=torch.float64, device=x.device)
    scales = {"x": dx_term_scale(x, groups, w, dy, eps), **param_grad_term_scales(x, groups, dy, eps)}
    params = {"x": x, "weight": weight, "bias": bias}
    for name, grad in grads.items():
        assert grad.dtype == params[name].dtype, f"d{name}: dtype {grad.dtype} != {params[name].dtype}"
        _close_to_scale(grad, grads_ref[name], scales[name], grad.dtype, f"d{name}", compute)


# --- rope, rope_backward, rope_


@st.composite
def rope_calls(draw):
    """(heads: {name: (shape, dtype, layout)}, cos/sin (shape, dtype, layout), index tensors' recipe, options)."""
    packed = draw(st.booleans())
    mode = draw(st.sampled_from(["gathered", "position_ids", "cu_seqlens", "mrope"]))
    half = draw(st.integers(1, 3))
    rot = 2 * half
    head_dim = rot + draw(st.integers(0, 3))
    max_pos = draw(st.integers(1, 6)) if mode == "cu_seqlens" else draw(st.integers(3, 8))  # distinct positions
    lengths = None
    if mode == "cu_seqlens":
        lengths = draw(st.lists(st.integers(0, max_pos), min_size=1, max_size=3))
        batch, seq = 1, sum(lengths)
    else:
        batch, seq = draw(st.integers(1, 2)), draw(st.integers(1, 5))
    heads_q, heads_k = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    zeroable = [heads_q, heads_k] if mode == "cu_seqlens" else [batch, seq, heads_q, heads_k]
    zeroable = _with_a_zero(draw, zeroable)
    if mode == "cu_seqlens":
        heads_q, heads_k = zeroable
    else:
        batch, seq, heads_q, heads_k = zeroable
    if packed:
        seq *= batch
        batch = 1
    single = draw(st.booleans())
    fused = not single and draw(st.booleans())  # q and k: disjoint views of one QKV buffer
    names = ("q",) if single else ("q", "k")
    shapes = {
        n: (seq, h, head_dim) if packed else (batch, h, seq, head_dim)
        for n, h in zip("qk", (heads_q, heads_k), strict=True)
    }
    data_dtype = draw(dtypes)
    heads = {n: (shapes[n], data_dtype if fused else draw(dtypes), draw(st.sampled_from(LAYOUTS))) for n in names}
    grad_dtypes = [draw(dtypes) for _ in names]  # the incoming gradients of rope_backward called directly

    options = {"pairs": draw(st.sampled_from(rope_reference.PAIRS))}
    index = {"dtype": draw(st.sampled_from([torch.int32, torch.int64]))}
    if mode == "gathered":
        table_shape = draw(st.sampled_from([(seq, rot), (1, seq, rot)] + ([] if packed else [(batch, seq, rot)])))
    else:
        table_shape = (max_pos, rot)
    if mode in ("position_ids", "mrope"):
        lead = (3,) if mode == "mrope" else ()
        choices = [(*lead, seq), (*lead, 1, seq)] + ([] if packed else [(*lead, batch, seq)])
        index.update(position_ids=draw(st.sampled_from(choices)), max_pos=max_pos, expanded=draw(st.booleans()),
                     batch_rank=len(lead) + 2)  # fmt: skip
    if mode == "cu_seqlens":
        index["lengths"] = lengths
    if mode == "mrope":
        t = draw(st.integers(0, half))
        h = draw(st.integers(0, half - t))
        options.update(mrope_section=[t, h, half - t - h], mrope_interleaved=draw(st.booleans()))
    tables = (table_shape, draw(dtypes), draw(dtypes), draw(st.sampled_from(LAYOUTS)))
    return heads, fused, grad_dtypes, tables, index, options


def _rope_heads(rand: Rand, heads: dict, fused: bool) -> dict[str, torch.Tensor]:
    if not fused:
        return {n: _make(rand, shape, dtype, layout) for n, (shape, dtype, layout) in heads.items()}
    (q_shape, dtype, _), (k_shape, _, _) = heads["q"], heads["k"]
    split = q_shape[1]  # Hq: dim 1 of (T, H, D) and of (B, H, S, D)
    if len(q_shape) == 3:  # (T, Hq + Hkv, D)
        buf = rand((q_shape[0], split + k_shape[1], q_shape[2]), dtype)
        return {"q": buf[:, :split], "k": buf[:, split:]}
    buf = rand((q_shape[0], q_shape[2], split + k_shape[1], q_shape[3]), dtype)  # (B, S, Hq + Hkv, D), HF's layout
    return {"q": buf[:, :, :split].transpose(1, 2), "k": buf[:, :, split:].transpose(1, 2)}


def _rope_indices(seed: int, index: dict) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    if "position_ids" in index:
        shape = index["position_ids"]
        ids = torch.randint(0, index["max_pos"], shape, generator=gen, dtype=torch.int64)
        if index["expanded"] and len(shape) == index["batch_rank"]:  # one row over the batch (stride 0), as HF's
            ids = ids[..., :1, :].expand(shape)
        return {"position_ids": ids.to(DEVICE, index["dtype"])}
    if "lengths" in index:
        cu = torch.tensor([0, *index["lengths"]]).cumsum(0)
        return {"cu_seqlens": cu.to(DEVICE, index["dtype"])}
    return {}


def _rotation_term_scale(fn, xs, cos, sin, options) -> list[torch.Tensor | None]:
    """Per element of fn's outputs (a rotation: y = x*c +- x'*s per pair), the
    summed magnitudes of its two terms, in float64: the float32 rounding
    error of a rotated element is relative to these, not to the element,
    which can cancel to ~0."""
    zero = torch.zeros_like(cos, dtype=torch.float64)
    abs_xs = [None if x is None else x.double().abs() for x in xs]
    by_cos = fn(*abs_xs, cos.double().abs(), zero, RopeOptions(**options))
    by_sin = fn(*abs_xs, zero, sin.double().abs(), RopeOptions(**options))
    return [None if c is None else c.abs() + s.abs() for c, s in zip(by_cos, by_sin, strict=True)]


def _check_rotated(outs, refs, scales, compute, what) -> None:
    for name, out, ref, scale in zip("qk", outs, refs, scales, strict=True):
        assert (out is None) == (ref is None), f"{what} {name}: output is {out} but the reference is {ref}"
        if out is not None:
            _close_to_scale(out, ref, scale, out.dtype, f"{what} {name}", compute)


@_fuzz(ci_examples=30)
@given(call=rope_calls(), seed=seeds)
def test_rope(call, seed):
    heads, fused, grad_dtypes, (table_shape, cos_dtype, sin_dtype, table_layout), index, options = call
    rand = _random(seed)
    xs = _rope_heads(rand, heads, fused)
    q, k = xs["q"], xs.get("k")
    cos, sin = (_make(rand, table_shape, dtype, table_layout) for dtype in (cos_dtype, sin_dtype))
    options = {**_rope_indices(seed, index), **options}
    data = [t for t in (q, k) if t is not None]
    compute = rope_reference.compute_dtype(*data)

    # rope and autograd through it (rope_backward as its backward)
    leaves = [t.detach().requires_grad_() for t in data]
    outs = torch.ops.liger.rope(*leaves, *([None] if k is None else []), cos, sin, **options)
    assert (outs[1] is None) == (k is None)
    for x, out in zip(data, outs, strict=False):
        assert out.dtype == x.dtype and out.stride() == torch.empty_like(x).stride()
    douts = [_make(rand, x.shape, x.dtype, "contiguous") for x in data]
    grads = torch.autograd.grad([o for o in outs if o is not None], leaves, douts)
    pad = [None] if k is None else []
    refs, grad_refs = reference_variant_grads(q, k, cos, sin, *(douts + pad), **options)
    scales = _rotation_term_scale(rope_reference.forward, (q, k), cos, sin, options)
    _check_rotated(outs, refs, scales, compute, "rope")
    grad_scales = _rotation_term_scale(rope_reference.backward, (*douts, *pad), cos, sin, options)
    _check_rotated((*grads, *pad), grad_refs, grad_scales, compute, "autograd grad")

    # rope_backward called directly, its incoming gradients of any dtype
    dys = [_make(rand, x.shape, dtype, layout) for x, dtype, (_, _, layout) in
           zip(data, grad_dtypes, heads.values(), strict=True)]  # fmt: skip
    direct = torch.ops.liger.rope_backward(*dys, *pad, cos, sin, **options)
    _, direct_refs = reference_variant_grads(q, k, cos, sin, *(dys + pad), **options)
    for dy, out in zip(dys, direct, strict=False):
        assert out.dtype == dy.dtype
    direct_scales = _rotation_term_scale(rope_reference.backward, (*dys, *pad), cos, sin, options)
    _check_rotated(direct, direct_refs, direct_scales, rope_reference.compute_dtype(*dys), "rope_backward")

    # rope_ in place, on tensors of the same layouts
    targets = _rope_heads(rand, heads, fused)
    targets = [targets[n].detach() for n in ("q", "k") if n in targets]
    for target, x in zip(targets, data, strict=True):
        if not _overlapping_layout(target):
            target.copy_(x)
    if any(_overlapping_layout(t) for t in targets):
        before = [t.clone() for t in targets]
        with pytest.raises(ValueError, match="overlapping memory"):
            torch.ops.liger.rope_(*targets, *pad, cos, sin, **options)
        assert all(torch.equal(a, b) for a, b in zip(before, targets, strict=True)), "rope_ wrote before refusing"
        return
    torch.ops.liger.rope_(*targets, *pad, cos, sin, **options)
    _check_rotated((*targets, *pad), refs, scales, compute, "rope_")


def _overlapping_layout(t: torch.Tensor) -> bool:
    """The elements of t overlap in memory (only the "expanded" layout's broadcast dim 0 does)."""
    return t.numel() > 1 and any(stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride(), strict=True))


def test_layouts_are_what_they_say():
    """The layout maker: strides as described, values random (not all equal)."""
    rand = _random(0)
    shape = (3, 2, 5)
    assert _make(rand, shape, torch.float32, "contiguous").is_contiguous()
    assert _make(rand, shape, torch.float32, "reversed").stride() == (1, 3, 6)
    sliced = _make(rand, shape, torch.float32, "sliced")
    assert sliced.stride()[-1] == 2 and sliced.storage_offset() > 0
    assert _make(rand, shape, torch.float32, "expanded").stride()[0] == 0
    assert _make(rand, shape, torch.float32, "sliced").unique().numel() == math.prod(shape)


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.float64])  # dy in x's dtype: exact enough to place its sum
def test_poly_norm_bias_gradient_is_not_rounded_to_the_weight_dtype(x_dtype):
    """Found by test_poly_norm: a float32 bias beside a bfloat16 weight got its
    gradient rounded to bfloat16 (poly_norm_backward returns dbias in weight's
    dtype).  sum(dy) is placed midway between two bfloat16 values, so that
    rounding would be off by half a bfloat16 step (2**-8)."""
    x = torch.randn(4, 8, dtype=x_dtype, device=DEVICE)
    weight = torch.randn(3, dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
    bias = torch.randn(1, dtype=torch.float32, device=DEVICE, requires_grad=True)
    dy = torch.randn(4, 8, dtype=torch.float64)
    target = 1 + (torch.randint(0, 128, ()).item() + 0.5) * 2**-7  # bfloat16's spacing in [1, 2) is 2**-7
    dy[0, 0] += target - dy.sum()
    dy = dy.to(DEVICE, x_dtype)
    (dbias,) = torch.autograd.grad(torch.ops.liger.poly_norm(x, weight, bias, 1e-6), (bias,), dy)
    assert dbias.dtype == torch.float32
    assert_close_to_scale(dbias, dy.double().sum().reshape(1), dy.double().abs().sum().reshape(1), torch.float32,
                          "dbias", compute_dtype(x_dtype))  # fmt: skip


def test_rope_in_place_accepts_an_empty_expanded_tensor():
    """Found by test_rope: rope_ refused a zero-size k with a stride-0 dim as
    "internally overlapping", though it has no elements (torch's in-place ops
    accept it); a non-empty expanded k is still refused."""
    q = torch.randn(2, 2, 4, device=DEVICE)
    cos, sin = torch.randn(2, 4, device=DEVICE), torch.randn(2, 4, device=DEVICE)
    expected = rope_reference.forward(q.double(), None, cos.double(), sin.double())[0]
    empty_k = torch.randn(1, 0, 4, device=DEVICE).expand(2, 0, 4)
    assert 0 in empty_k.stride()
    torch.ops.liger.rope_(q, empty_k, cos, sin)
    assert_close_to_ref(q, expected, torch.float32, "q")
    with pytest.raises(ValueError, match="k has internally overlapping memory"):
        torch.ops.liger.rope_(q, torch.randn(1, 1, 4, device=DEVICE).expand(2, 1, 4), cos, sin)
