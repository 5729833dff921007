"""rope_ (in place): exact memory-overlap refusal, eagerly and under
torch.compile, and torch's in-place autograd semantics (version counter,
leaf error, saved-tensor error, gradients through the rotation)."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from csrc_free_ops.rope import reference
from registrations import overlap
from registrations.eager import eager_call
from tests.helpers import DEVICE, assert_close_to_ref
from tests.rope_cases import hf_tables

D = 8
# rope_ through the dispatcher, and as liger_nn calls it (registrations/eager.py: plain calls skip the
# dispatcher and run the signature's prepared rotation).
CALLERS = {"op": torch.ops.liger.rope_, "eager_call": eager_call(torch.ops.liger.rope_)}


@pytest.fixture(params=sorted(CALLERS))
def rope_(request):
    return CALLERS[request.param]


def _tables(seq=3, rot=D, dtype=torch.float32):
    return hf_tables(1, seq, rot, dtype)


def _rotated(q, k, cos, sin):
    return reference.forward(q.double(), k.double(), cos.double(), sin.double())


# --- overlap


def _fused_qkv(b=2, s=3, hq=4, hk=2):
    """q and k as HF's views of one fused QKV projection: disjoint, interleaved in memory."""
    qkv = torch.randn(b, s, (hq + 2 * hk) * D, device=DEVICE)
    q = qkv[..., : hq * D].view(b, s, hq, D).transpose(1, 2)
    k = qkv[..., hq * D : (hq + hk) * D].view(b, s, hk, D).transpose(1, 2)
    return qkv, q, k


OVERLAPPING = {
    # name: (q, k) built from one buffer
    "head of k": lambda buf: (buf[:, 1:2], buf),
    "same tensor": lambda buf: (buf, buf),
    "half of head_dim": lambda buf: (buf[..., 0:4], buf[..., 2:6]),
    "one element": lambda buf: (buf[:, :, :, 0:4], buf[:, :, :, 3:7]),
    "strided into each other": lambda buf: (buf[..., 0::2], buf[..., 4:8]),
    "fused rows shifted by one head": lambda buf: (buf[:, 0:2], buf[:, 1:3]),
}


@pytest.mark.parametrize("case", sorted(OVERLAPPING))
def test_in_place_refuses_q_and_k_sharing_memory(case, rope_):
    """Also after a call at the same signature with q and k apart: where they lie is checked
    on every call, not once per signature."""
    buf, other = torch.randn(1, 3, 3, D, device=DEVICE), torch.randn(1, 3, 3, D, device=DEVICE)
    q, k = OVERLAPPING[case](buf)
    cos, sin = _tables(3, q.shape[-1])
    rope_(q, OVERLAPPING[case](other)[1], cos, sin)
    before = buf.clone()
    with pytest.raises(ValueError, match=r"liger\.rope_: q and k overlap in memory"):
        rope_(q, k, cos, sin)
    assert torch.equal(buf, before), "rope_ wrote before refusing"


def test_in_place_accepts_disjoint_views_of_one_buffer(rope_):
    """Fused QKV views (interleaved in memory, no element shared) are rotated,
    and the v part of the buffer is left alone."""
    qkv, q, k = _fused_qkv()
    before = qkv.clone()
    q_ref, k_ref = _rotated(q, k, *_tables())
    rope_(q, k, *_tables())
    assert_close_to_ref(q, q_ref, torch.float32, "q")
    assert_close_to_ref(k, k_ref, torch.float32, "k")
    assert torch.equal(qkv[..., 6 * D :], before[..., 6 * D :]), "v changed"


SELF_OVERLAPPING = {
    "expanded heads": lambda: torch.randn(2, 1, 3, D, device=DEVICE).expand(2, 4, 3, D),
    "as_strided rows overlapping": lambda: torch.randn(64, device=DEVICE).as_strided((1, 2, 3, D), (0, 4, 16, 1)),
    "heads one element apart": lambda: torch.randn(64, device=DEVICE).as_strided((1, 3, 2, D), (64, 1, 16, 1)),
}


@pytest.mark.parametrize("case", sorted(SELF_OVERLAPPING))
def test_in_place_refuses_self_overlapping_q(case):
    q = SELF_OVERLAPPING[case]()
    k = torch.randn(q.shape[0], 1, q.shape[2], D, device=DEVICE)
    with pytest.raises(ValueError, match=r"liger\.rope_: q has internally overlapping memory"):
        torch.ops.liger.rope_(q, k, *_tables(q.shape[2]))


def _offsets(t: torch.Tensor) -> set[int]:
    ranges = [range(n) for n in t.shape]
    return {t.storage_offset() + sum(i * s for i, s in zip(idx, t.stride(), strict=True))
            for idx in itertools.product(*ranges)}  # fmt: skip


def _count(t: torch.Tensor) -> int:
    return len(list(itertools.product(*[range(n) for n in t.shape])))


layouts = st.tuples(
    st.integers(0, 6),  # storage offset
    st.lists(st.tuples(st.integers(1, 3), st.integers(0, 9)), min_size=1, max_size=3),  # (size, stride)
)


@given(a=layouts, b=layouts)
def test_overlap_tests_agree_with_enumerating_the_elements(a, b):
    storage = torch.zeros(128)
    views = []
    for offset, dims in (a, b):
        sizes, strides = zip(*dims, strict=True)
        views.append(storage.as_strided(sizes, strides, offset))
    x, y = views
    assert overlap.self_overlapping(x) == (len(_offsets(x)) < _count(x))
    assert overlap.overlapping(x, y) == bool(_offsets(x) & _offsets(y))


def test_overlap_across_storages_and_dtypes():
    a, b = torch.zeros(16), torch.zeros(16)
    assert not overlap.overlapping(a, b)
    raw = torch.zeros(32, dtype=torch.uint8)
    as_f32, as_f16 = raw.view(torch.float32), raw.view(torch.float16)
    assert overlap.overlapping(as_f32[1:2], as_f16[3:4])  # bytes 4..7 and 6..7
    assert not overlap.overlapping(as_f32[1:2], as_f16[4:5])  # bytes 4..7 and 8..9


def test_self_overlap_of_large_layouts_is_decided_within_the_step_budget():
    """A contiguous q of 2^31+ elements has a dim of 1.1M: its coefficients
    are bounded by what the smaller strides reach, not walked one by one
    (walking them spent the budget, which answers "overlapping")."""
    q = torch.empty(1, 16, 1_100_000, 128, device="meta")
    assert not overlap.self_overlapping(q)
    assert not overlap.self_overlapping(q.transpose(1, 2))
    assert overlap.self_overlapping(q.expand(2, -1, -1, -1))
    assert overlap.self_overlapping(q.as_strided((16, 1_100_000, 128), (128, 128, 1)))


def _decode(q, k, cos, sin):
    torch.ops.liger.rope_(q, k, cos, sin)
    return q + 1.0


def test_compiled_in_place_refuses_overlap_and_accepts_disjoint_views():
    """Under torch.compile the check runs on fake tensors while tracing; the
    user gets torch.compile's error carrying the op's message."""
    fn = torch.compile(_decode, fullgraph=True, dynamic=True, backend="aot_eager")
    qkv, q, k = _fused_qkv()
    q_ref, k_ref = _rotated(q, k, *_tables())
    out = fn(q, k, *_tables())
    assert_close_to_ref(out, q_ref + 1.0, torch.float32, "q + 1")
    assert_close_to_ref(k, k_ref, torch.float32, "k")
    buf = torch.randn(1, 3, 3, D, device=DEVICE)
    before = buf.clone()
    with pytest.raises(Exception, match=r"liger\.rope_: q and k overlap in memory"):
        fn(buf[..., 0:4], buf[..., 2:6], *_tables(3, 4))
    assert torch.equal(buf, before)


# --- autograd


def test_leaf_requiring_grad_raises_like_torch_in_place_ops(rope_):
    q = torch.randn(1, 2, 3, D, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 1, 3, D, device=DEVICE)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        rope_(q, k, *_tables())
    with torch.no_grad():
        rope_(q, k, *_tables())  # as torch allows under no_grad


def test_version_counter_is_bumped_with_and_without_grad_mode(rope_):
    q = torch.randn(1, 2, 3, D, device=DEVICE)
    k = torch.randn(1, 1, 3, D, device=DEVICE)
    versions = q._version, k._version
    rope_(q, k, *_tables())
    assert q._version > versions[0] and k._version > versions[1]
    versions = q._version, k._version
    with torch.no_grad():
        rope_(q, k, *_tables())
    assert q._version > versions[0] and k._version > versions[1]


def _loss_through_in_place(x, y, cos, sin, w, v, rope_=torch.ops.liger.rope_):
    q, k = x * 2.0, y + 0.0
    rope_(q, k, cos, sin)
    return (q * w).sum() + (k * v).sum()


def test_gradients_flow_through_the_rotation(rope_):
    """q = x * 2 rotated in place: x's gradient is that of the functional
    rotation, against float64."""
    x = torch.randn(1, 2, 3, D, device=DEVICE, requires_grad=True)
    y = torch.randn(1, 1, 3, D, device=DEVICE, requires_grad=True)
    w, v = torch.randn_like(x), torch.randn_like(y)
    cos, sin = _tables()
    got = torch.autograd.grad(_loss_through_in_place(x, y, cos, sin, w, v, rope_), (x, y))
    x64, y64 = (t.detach().double().requires_grad_() for t in (x, y))
    q64, k64 = reference.forward(x64 * 2.0, y64 + 0.0, cos.double(), sin.double())
    want = torch.autograd.grad((q64 * w.double()).sum() + (k64 * v.double()).sum(), (x64, y64))
    for g, r, what in zip(got, want, ("dx", "dy"), strict=True):
        assert_close_to_ref(g, r, torch.float32, what)


def test_rotating_a_saved_tensor_makes_backward_raise(rope_):
    x = torch.randn(1, 2, 3, D, device=DEVICE, requires_grad=True)
    k = torch.randn(1, 1, 3, D, device=DEVICE)
    q = x + 0.0
    z = (q * q).sum()
    rope_(q, k, *_tables())
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()


def test_tables_requiring_grad_raise_before_writing(rope_):
    q = torch.randn(1, 2, 3, D, device=DEVICE, requires_grad=True) * 1.0
    k = torch.randn(1, 1, 3, D, device=DEVICE)
    cos, sin = _tables()
    before = q.detach().clone()
    with pytest.raises(ValueError, match="cos and sin get no gradient"):
        rope_(q, k, cos.requires_grad_(), sin)
    assert torch.equal(q.detach(), before)


def test_compiled_in_place_autograd_matches_eager():
    cos, sin = _tables()
    fn = torch.compile(_loss_through_in_place, fullgraph=True, backend="aot_eager")
    x = torch.randn(1, 2, 3, D, device=DEVICE, requires_grad=True)
    y = torch.randn(1, 1, 3, D, device=DEVICE, requires_grad=True)
    w, v = torch.randn_like(x), torch.randn_like(y)
    got = torch.autograd.grad(fn(x, y, cos, sin, w, v), (x, y))
    want = torch.autograd.grad(_loss_through_in_place(x, y, cos, sin, w, v), (x, y))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)

    def saved(x, k, cos, sin):
        q = x + 0.0
        z = (q * q).sum()
        torch.ops.liger.rope_(q, k, cos, sin)
        return z

    # AOTAutograd traces the joint graph under anomaly mode (to keep forward stack traces), so the
    # error comes with torch's anomaly warning naming the backward node that found it: expected here.
    with warnings.catch_warnings(record=True) as caught, pytest.raises(Exception, match="modified by an inplace"):
        warnings.simplefilter("always")
        torch.compile(saved, fullgraph=True, backend="aot_eager")(x, y.detach(), cos, sin).backward()
    unexpected = [str(w.message) for w in caught if "Error detected in MulBackward0" not in str(w.message)]
    assert not unexpected, unexpected

    def leaf(x, k, cos, sin):
        torch.ops.liger.rope_(x, k, cos, sin)
        return x.sum()

    with pytest.raises(Exception, match="a leaf Variable that requires grad"):
        torch.compile(leaf, fullgraph=True, backend="aot_eager")(x, y.detach(), cos, sin)


def _projected(fused: bool, rope_=None):
    """x -> q, k, v as HF makes them (views of one fused buffer, or of one
    projection each), q and k rotated by rope_ or rope; a loss over all three."""
    g = torch.Generator(device=DEVICE).manual_seed(3)
    b, s, hq, hk = 2, 3, 2, 1
    f64 = torch.float64
    x = torch.randn(b, s, 6, dtype=f64, device=DEVICE, generator=g).requires_grad_()
    w = torch.randn((hq + 2 * hk) * D, 6, dtype=f64, device=DEVICE, generator=g).requires_grad_()
    cos, sin = (t.double() for t in _tables(s))
    if fused:
        qkv = x @ w.t()
        q, k, v = qkv[..., : hq * D], qkv[..., hq * D : (hq + hk) * D], qkv[..., (hq + hk) * D :]
    else:
        q, k, v = (x @ part.t() for part in w.split([hq * D, hk * D, hk * D]))
    q, k, v = (t.reshape(b, s, -1, D).transpose(1, 2) for t in (q, k, v))
    if rope_ is not None:
        rope_(q, k, cos, sin)
    else:
        q, k = torch.ops.liger.rope(q, k, cos, sin)
    loss = (q.sum(1, keepdim=True) * k * v).square().sum()
    return q.detach().clone(), torch.autograd.grad(loss, (x, w))


@pytest.mark.parametrize("fused", [False, True], ids=["projection_each", "fused_qkv"])
def test_in_place_on_hf_views_gives_the_out_of_place_gradients(fused, rope_):
    """q and k are views (the whole of their projection's output, or slices of
    one fused QKV buffer sharing it with v): autograd records the rotation on
    the bases, and the gradients are the out-of-place op's, in float64."""
    q_in, grads_in = _projected(fused, rope_)
    q_out, grads_out = _projected(fused)
    assert_close_to_ref(q_in, q_out, torch.float64, "q")
    for g, want, what in zip(grads_in, grads_out, ("dx", "dw"), strict=True):
        assert_close_to_ref(g, want, torch.float64, what)


def test_views_autograd_forbids_modifying_in_place_raise(rope_):
    x = torch.randn(1, 3, 4 * D, device=DEVICE, requires_grad=True) * 1.0
    q, k = (t.view(1, 3, 2, D).transpose(1, 2) for t in x.split(2 * D, dim=-1))
    with pytest.raises(RuntimeError, match=r"liger\.rope_: q is a view autograd does not allow modifying in place"):
        rope_(q, k, *_tables())
