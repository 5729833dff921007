"""torch.func over every op (registrations/functorch.py): vmap of the op and
of its gradient, and forward-mode AD (torch.func.jvp, torch.autograd.forward_ad,
jvp over grad), each against the same transform of the op's float64
pure-PyTorch reference; and the clear errors where an op takes no AD."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.func import grad, jvp, vmap

from csrc_free_ops.glu import reference as glu_ref
from csrc_free_ops.group_norm import reference as group_norm_ref
from csrc_free_ops.layer_norm import reference as layer_norm_ref
from csrc_free_ops.poly_norm import reference as poly_norm_ref
from csrc_free_ops.rms_norm import reference as rms_norm_ref
from csrc_free_ops.rope import reference as rope_ref
from registrations import _library
from tests.helpers import DEVICE, assert_close_to_ref

liger = torch.ops.liger


@dataclass(frozen=True)
class Op:
    """fn(*tensors) with the op, ref(*tensors) with the reference; both return one tensor."""

    fn: Callable
    ref: Callable
    shapes: tuple[tuple[int, ...], ...]  # of the tensors, data first
    params: tuple[int, ...]  # positions of the parameters (or tables)


OPS = {
    "poly_norm": Op(
        lambda x, w, b: liger.poly_norm(x, w, b, 1e-6),
        lambda x, w, b: poly_norm_ref.forward(x, w, b, 1e-6),
        ((2, 16), (3,), (1,)),
        (1, 2),
    ),
    # q and k rotated together; one output keeps the transforms' bookkeeping simple.
    "rope": Op(
        lambda q, k, cos, sin: torch.cat([o.flatten() for o in liger.rope(q, k, cos, sin)]),
        lambda q, k, cos, sin: torch.cat([o.flatten() for o in rope_ref.forward(q, k, cos, sin)]),
        ((1, 2, 3, 8), (1, 1, 3, 8), (3, 8), (3, 8)),
        (2, 3),
    ),
    "group_norm": Op(
        lambda x, w, b: liger.group_norm(x, 2, w, b, 1e-5),
        lambda x, w, b: group_norm_ref.forward(x, 2, w, b, 1e-5),
        ((2, 4, 3), (4,), (4,)),
        (1, 2),
    ),
    "swiglu": Op(liger.swiglu, lambda g, u: glu_ref.forward(g, u, "silu"), ((2, 16), (2, 16)), (1,)),
    "geglu": Op(liger.geglu, lambda g, u: glu_ref.forward(g, u, "gelu_tanh"), ((2, 16), (2, 16)), (1,)),
    "geglu_exact": Op(liger.geglu_exact, lambda g, u: glu_ref.forward(g, u, "gelu"), ((2, 16), (2, 16)), (1,)),
    "rms_norm": Op(
        lambda x, w: liger.rms_norm(x, w, 1e-6, offset=1.0, casting_mode="gemma"),
        lambda x, w: rms_norm_ref.forward(x, w, 1e-6, 1.0, "gemma"),
        ((2, 3, 8), (8,)),
        (1,),
    ),
    "layer_norm": Op(
        lambda x, w, b: liger.layer_norm(x, w, b, 1e-5),
        lambda x, w, b: layer_norm_ref.forward(x, w, b, 1e-5),
        ((3, 8), (8,), (8,)),
        (1, 2),
    ),
}
BATCH = 2  # vmapped samples


def _inputs(op: Op, seed: int, batch: int | None = None, batched: tuple[int, ...] = (0,)) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, shape in enumerate(op.shapes):
        shape = (batch, *shape) if batch and i in batched else shape
        out.append(torch.randn(*shape, generator=gen).to(DEVICE))
    return out


def _f64(ts):
    return [t.double() for t in ts]


def _per_sample(fn: Callable, args, in_dims):
    """What vmap(fn, in_dims)(*args) means, by a loop (the references write outputs in place: no vmap)."""
    outs = [fn(*(a if d is None else a.select(d, i) for a, d in zip(args, in_dims, strict=True))) for i in range(BATCH)]
    if isinstance(outs[0], tuple):
        return tuple(torch.stack(o) for o in zip(*outs, strict=True))
    return torch.stack(outs)


@pytest.fixture(autouse=True)
def _no_fallback():
    """vmap must use the ops' rules, not torch's slow per-sample fallback (which warns)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield
    fallbacks = [str(w.message) for w in seen if "batching rule" in str(w.message)]
    assert not fallbacks, fallbacks


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("batched", ["data", "params"])
def test_vmap(name, batched):
    op = OPS[name]
    which = (0,) if batched == "data" else op.params
    args = _inputs(op, 1, BATCH, which)
    in_dims = tuple(0 if i in which else None for i in range(len(args)))
    got = vmap(op.fn, in_dims=in_dims)(*args)
    want = _per_sample(op.ref, _f64(args), in_dims)
    assert_close_to_ref(got, want, torch.float32, f"vmap({name}) over {batched}")


@pytest.mark.parametrize("name", OPS)
def test_vmap_over_grad(name):
    """Per-sample gradients of every differentiable input (rope: q and k only)."""
    op = OPS[name]
    args = _inputs(op, 2, BATCH, (0,))
    argnums = (0, 1) if name == "rope" else (0, *op.params)
    in_dims = (0,) + (None,) * (len(args) - 1)

    def loss(fn):
        return lambda *a: fn(*a).pow(2).sum()

    got = vmap(grad(loss(op.fn), argnums=argnums), in_dims=in_dims)(*args)
    want = _per_sample(grad(loss(op.ref), argnums=argnums), _f64(args), in_dims)
    for i, g, w in zip(argnums, got, want, strict=True):
        assert_close_to_ref(g, w, torch.float32, f"per-sample grad of {name} input {i}")


@pytest.mark.parametrize("name", OPS)
def test_jvp(name):
    """Tangents on every input, the parameters (rope: the tables) included."""
    op = OPS[name]
    args, tangents = _inputs(op, 3), _inputs(op, 4)
    _, got = jvp(op.fn, tuple(args), tuple(tangents))
    _, want = jvp(op.ref, tuple(_f64(args)), tuple(_f64(tangents)))
    assert_close_to_ref(got, want, torch.float32, f"jvp of {name}")


@pytest.mark.parametrize("name", OPS)
def test_forward_ad_dual_tensors(name):
    op = OPS[name]
    args, tangents = _inputs(op, 5), _inputs(op, 6)
    with fwAD.dual_level():
        got = fwAD.unpack_dual(op.fn(fwAD.make_dual(args[0], tangents[0]), *args[1:])).tangent
    assert got is not None, f"{name}: forward AD dropped the tangent"
    _, want = jvp(lambda x: op.ref(x, *_f64(args[1:])), (args[0].double(),), (tangents[0].double(),))
    assert_close_to_ref(got, want, torch.float32, f"forward-AD tangent of {name}")


@pytest.mark.parametrize(
    "name", ["poly_norm", "group_norm", "swiglu", "geglu", "geglu_exact", "rms_norm", "layer_norm"]
)
def test_jvp_over_grad(name):
    """Hessian-vector products (forward over reverse) reach the backward op's tangent."""
    op = OPS[name]
    args, (tangent, *_) = _inputs(op, 7), _inputs(op, 8)

    def g(fn, rest):
        return grad(lambda x: fn(x, *rest).pow(3).sum())

    _, got = jvp(g(op.fn, args[1:]), (args[0],), (tangent,))
    _, want = jvp(g(op.ref, _f64(args[1:])), (args[0].double(),), (tangent.double(),))
    assert_close_to_ref(got, want, torch.float32, f"Hessian-vector product of {name}")


def test_forward_ad_without_a_rule_names_the_op(monkeypatch):
    monkeypatch.delitem(_library.JVP_RULES, liger.poly_norm.default)
    x, w, b = _inputs(OPS["poly_norm"], 9)
    with pytest.raises(NotImplementedError, match=r"liger\.poly_norm: forward-mode AD"):
        jvp(lambda x: liger.poly_norm(x, w, b, 1e-6), (x,), (x,))


def test_rope_in_place_under_vmap_and_its_refusal_of_forward_ad():
    """rope_ under vmap; forward-mode AD through it raises naming it (reverse
    mode goes through the rotation, tests/test_rope_inplace.py)."""
    q, k, cos, sin = _inputs(OPS["rope"], 10, BATCH, (0, 1))
    want_q, want_k = _per_sample(rope_ref.forward, _f64((q, k, cos, sin)), (0, 0, None, None))
    vmap(lambda q, k: liger.rope_(q, k, cos, sin) or q)(q, k)
    assert_close_to_ref(q, want_q, torch.float32, "rope_ under vmap (q)")
    assert_close_to_ref(k, want_k, torch.float32, "rope_ under vmap (k)")
    with pytest.raises(NotImplementedError, match=r"liger\.rope_: forward-mode AD"):
        jvp(lambda q: liger.rope_(q, k[0].clone(), cos, sin) or q, (q[0].clone(),), (q[0],))
    with pytest.raises(NotImplementedError, match=r"liger\.rope_: gradients through the in-place rotation under"):
        torch.func.grad(lambda q: liger.rope_(q * 1.0, k[0].clone(), cos, sin) or q.sum())(q[0].clone())


def test_every_op_has_a_vmap_rule_and_a_forward_ad_rule():
    """A new op must say how it batches and how tangents flow (or that tangents reaching it raise: the
    in-place rope_ and glu backwards)."""
    from registrations import functorch

    ops = {getattr(liger, name).default for name in liger}
    assert set(functorch.VMAP_RULES) == ops
    assert set(functorch.JVP) | functorch.WITHOUT_JVP == ops
    assert functorch.WITHOUT_JVP == {liger.rope_.default, liger.swiglu_backward_.default,
                                     liger.geglu_backward_.default, liger.geglu_exact_backward_.default}  # fmt: skip
