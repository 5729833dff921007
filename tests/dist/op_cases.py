"""Every liger op and backward op on DTensors, forward and backward, against
the single-process result on the full tensor, for the shardings of
registrations/sharding.py (and a few it must redistribute).

Each rank draws the same inputs (seeded), computes the full result alone,
then the DTensor result, and compares the gathered values.  Where the rule
keeps a placement, the test checks that too.
"""

from __future__ import annotations

import functools

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import registrations  # noqa: F401  (defines torch.ops.liger.* and their sharding rules)
from tests.dist.compare import assert_close
from tests.dist.harness import Case, Context

TORCH_BEFORE_2_12 = tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 12)

R = Replicate()
liger = torch.ops.liger


def _inputs(ctx: Context, seed: int, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen).to(ctx.device) for shape in shapes]


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_()


def _dtensor(t: torch.Tensor, mesh, placements, grad: bool = True) -> DTensor:
    d = distribute_tensor(t.detach(), mesh, list(placements))
    return d.requires_grad_() if grad else d


def _assert_placements(t: DTensor, want, what: str) -> None:
    assert tuple(t.placements) == tuple(want), f"{what}: placements {t.placements}, expected {tuple(want)}"


def _assert_partial_or(t: DTensor, want, what: str) -> None:
    """A parameter gradient reduced over shards: Partial, or ``want`` (e.g. channel shards)."""
    ok = all(isinstance(p, Partial) or p == w for p, w in zip(t.placements, want, strict=True))
    assert ok, f"{what}: placements {t.placements}"


# ---------------------------------------------------------------------------
# poly_norm


def poly_norm(ctx: Context, shape: tuple[int, ...], placements: tuple, mesh_shape: tuple[int, ...] | None = None):
    x, w, b, g = _inputs(ctx, 1, shape, (3,), (1,), shape)
    xs, ws, bs = _leaf(x), _leaf(w), _leaf(b)
    y = liger.poly_norm(xs, ws, bs, 1e-6)
    y.backward(g)

    mesh = ctx.mesh(mesh_shape)
    dx, dw, db = _dtensor(x, mesh, placements), _dtensor(w, mesh, [R] * mesh.ndim), _dtensor(b, mesh, [R] * mesh.ndim)
    dy = liger.poly_norm(dx, dw, db, 1e-6)
    last = len(shape) - 1
    keeps = all(not isinstance(p, Shard) or p.dim != last for p in placements)
    if keeps:  # rows sharded: no communication, y and dx sharded like x
        _assert_placements(dy, placements, "y")
    dy.backward(distribute_tensor(g, mesh, list(dy.placements)))
    assert_close(dy, y, "y")
    assert_close(dx.grad, xs.grad, "dx")
    assert_close(dw.grad, ws.grad, "dweight")
    assert_close(db.grad, bs.grad, "dbias")
    if keeps:
        _assert_placements(dx.grad, placements, "dx")
        _assert_partial_or(dw.grad, [R] * mesh.ndim, "dweight")


# ---------------------------------------------------------------------------
# rope: q (B, Hq, S, D), k (B, Hk, S, D); GQA with both head counts divisible by the mesh size.


def _rope_shapes(ctx: Context, seq: int, table: str, rot: int):
    ws = ctx.world_size
    batch, head_dim = ws, 16
    q, k = (batch, 2 * ws, seq, head_dim), (batch, ws, seq, head_dim)
    t = {"2d": (seq, rot), "1sr": (1, seq, rot), "bsr": (batch, seq, rot)}[table]
    return q, k, t


def rope(ctx: Context, q_at, k_at, table: str = "2d", table_at=None, seq: int | None = None, rot: int = 16,
         compiled: bool = False):  # fmt: skip
    """q sharded by q_at, k by k_at (placements on a 1-D mesh), cos/sin by table_at (default replicated)."""
    seq = seq or 2 * ctx.world_size
    q_shape, k_shape, t_shape = _rope_shapes(ctx, seq, table, rot)
    q, k, cos, sin, gq, gk = _inputs(ctx, 2, q_shape, k_shape, t_shape, t_shape, q_shape, k_shape)
    qs, ks = _leaf(q), _leaf(k)
    oq, ok = liger.rope(qs, ks, cos, sin)
    torch.autograd.backward([oq, ok], [gq, gk])

    mesh = ctx.mesh()
    table_at = table_at or (R,)
    dq, dk = _dtensor(q, mesh, q_at), _dtensor(k, mesh, k_at)
    dcos, dsin = _dtensor(cos, mesh, table_at, grad=False), _dtensor(sin, mesh, table_at, grad=False)
    doq, dok = (_compiled(liger.rope) if compiled else liger.rope)(dq, dk, dcos, dsin)
    _assert_placements(doq, q_at, "q_out")
    _assert_placements(dok, k_at, "k_out")
    grads = [distribute_tensor(gq, mesh, list(q_at)), distribute_tensor(gk, mesh, list(k_at))]
    torch.autograd.backward([doq, dok], grads)
    assert_close(doq, oq, "q_out")
    assert_close(dok, ok, "k_out")
    assert_close(dq.grad, qs.grad, "dq")
    assert_close(dk.grad, ks.grad, "dk")
    if compiled and TORCH_BEFORE_2_12:
        return  # torch 2.11's compiled backward hands the gradients back replicated (docs/compat.md)
    _assert_placements(dq.grad, q_at, "dq")
    _assert_placements(dk.grad, k_at, "dk")


def rope_in_place(ctx: Context, q_at, k_at, table: str = "2d", table_at=None):
    seq = 2 * ctx.world_size
    q_shape, k_shape, t_shape = _rope_shapes(ctx, seq, table, 16)
    q, k, cos, sin = _inputs(ctx, 3, q_shape, k_shape, t_shape, t_shape)
    mesh = ctx.mesh()
    dq, dk = _dtensor(q, mesh, q_at, grad=False), _dtensor(k, mesh, k_at, grad=False)
    table_at = table_at or (R,)
    dcos, dsin = _dtensor(cos, mesh, table_at, grad=False), _dtensor(sin, mesh, table_at, grad=False)
    want_q, want_k = liger.rope(q, k, cos, sin)
    assert liger.rope_(dq, dk, dcos, dsin) is None
    _assert_placements(dq, q_at, "q")
    _assert_placements(dk, k_at, "k")
    assert_close(dq, want_q, "q (rotated in place)")
    assert_close(dk, want_k, "k (rotated in place)")


def rope_in_place_refuses(ctx: Context):
    """In place, q and k cannot be redistributed: mismatched placements are a clear error."""
    q_shape, k_shape, t_shape = _rope_shapes(ctx, 2 * ctx.world_size, "2d", 16)
    q, k, cos, sin = _inputs(ctx, 4, q_shape, k_shape, t_shape, t_shape)
    mesh = ctx.mesh()
    dq, dk = _dtensor(q, mesh, [Shard(0)], grad=False), _dtensor(k, mesh, [Shard(2)], grad=False)
    dcos, dsin = _dtensor(cos, mesh, [R], grad=False), _dtensor(sin, mesh, [R], grad=False)
    before = dq.to_local().clone()
    try:
        liger.rope_(dq, dk, dcos, dsin)
    except ValueError as e:
        assert "liger.rope_" in str(e) and "Shard(dim=0)" in str(e), str(e)
    else:
        raise AssertionError("rope_ with q on batch and k on sequence did not raise")
    assert torch.equal(dq.to_local(), before), "rope_ wrote into q before refusing"


# ---------------------------------------------------------------------------
# group_norm: x (N, C, *)


def _compiled(fn):
    """fn under torch.compile (aot_eager: dynamo and AOT autograd trace the DTensor rules, no Inductor compile)."""
    torch._dynamo.reset()
    return torch.compile(fn, backend="aot_eager", fullgraph=True, dynamic=True)


def group_norm(ctx: Context, shape, num_groups: int, placements, affine: bool = True, keeps: bool = True,
               mesh_shape: tuple[int, ...] | None = None, compiled: bool = False):  # fmt: skip
    """keeps: the rule shards the op as x is (batch, or channels holding whole groups).
    compiled: the DTensor call traced by torch.compile."""
    channels = shape[1]
    x, w, b, g = _inputs(ctx, 5, shape, (channels,), (channels,), shape)
    xs = _leaf(x)
    ws, bs = (_leaf(w), _leaf(b)) if affine else (None, None)
    y = liger.group_norm(xs, num_groups, ws, bs, 1e-5)
    y.backward(g)

    mesh = ctx.mesh(mesh_shape)
    dx = _dtensor(x, mesh, placements)
    dw, db = (_dtensor(w, mesh, [R] * mesh.ndim), _dtensor(b, mesh, [R] * mesh.ndim)) if affine else (None, None)
    op = _compiled(liger.group_norm) if compiled else liger.group_norm
    dy = op(dx, num_groups, dw, db, 1e-5)
    if keeps:
        _assert_placements(dy, placements, "y")
    dy.backward(distribute_tensor(g, mesh, list(dy.placements)))
    assert_close(dy, y, "y")
    assert_close(dx.grad, xs.grad, "dx")
    if keeps:
        _assert_placements(dx.grad, placements, "dx")
    if affine:
        assert_close(dw.grad, ws.grad, "dweight")
        assert_close(db.grad, bs.grad, "dbias")
        if keeps:  # batch shards: Partial; channel shards: Shard(0)
            want = [Shard(0) if p == Shard(1) else R for p in placements]
            _assert_partial_or(dw.grad, want, "dweight")
            _assert_partial_or(db.grad, want, "dbias")


# ---------------------------------------------------------------------------
# rms_norm, layer_norm: rows over any dim but the last (sequence parallel, per-head norms)


ROW_NORMS = {
    "rms_norm": lambda x, w, b: liger.rms_norm(x, w, 1e-6),
    "rms_norm_gemma": lambda x, w, b: liger.rms_norm(x, w, 1e-6, offset=1.0, casting_mode="gemma"),
    "layer_norm": lambda x, w, b: liger.layer_norm(x, w, b, 1e-5),
}


def row_norm(ctx: Context, name: str, shape: tuple[int, ...], placements: tuple):
    x, w, b, g = _inputs(ctx, 3, shape, shape[-1:], shape[-1:], shape)
    xs, ws, bs = _leaf(x), _leaf(w), _leaf(b)
    fn = ROW_NORMS[name]
    y = fn(xs, ws, bs)
    y.backward(g)

    mesh = ctx.mesh(None)
    dx, dw, db = _dtensor(x, mesh, placements), _dtensor(w, mesh, [R]), _dtensor(b, mesh, [R])
    dy = fn(dx, dw, db)
    if all(not isinstance(p, Shard) or p.dim != len(shape) - 1 for p in placements):
        _assert_placements(dy, placements, "y")
    dy.backward(distribute_tensor(g, mesh, list(dy.placements)))
    assert_close(dy, y, "y")
    assert_close(dx.grad, xs.grad, "dx")
    assert_close(dw.grad, ws.grad, "dweight")
    if name == "layer_norm":
        assert_close(db.grad, bs.grad, "dbias")


# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# swiglu, geglu: pointwise over gate and up (B, S, F)


def glu(ctx: Context, name: str, gate_at, up_at=None, keeps: bool = True):
    """gate and up placed by gate_at / up_at (default: gate's); keeps: y and the gradients keep gate's placements."""
    ws = ctx.world_size
    shape = (2 * ws, 2 * ws, 4 * ws)
    gate, up, g = _inputs(ctx, 6, shape, shape, shape)
    gs, us = _leaf(gate), _leaf(up)
    op = getattr(liger, name)
    y = op(gs, us)
    y.backward(g)

    mesh = ctx.mesh()
    dgate, dup = _dtensor(gate, mesh, gate_at), _dtensor(up, mesh, up_at or gate_at)
    dy = op(dgate, dup)
    if keeps:
        _assert_placements(dy, gate_at, "y")
    dy.backward(distribute_tensor(g, mesh, list(dy.placements)))
    assert_close(dy, y, "y")
    assert_close(dgate.grad, gs.grad, "dgate")
    assert_close(dup.grad, us.grad, "dup")
    if keeps:
        _assert_placements(dgate.grad, gate_at, "dgate")
        _assert_placements(dup.grad, gate_at, "dup")


# ---------------------------------------------------------------------------
# cross_entropy, fused_linear_cross_entropy: rows (BT) sharded, the classes whole.

IGNORE = -100


def _targets(ctx: Context, rows: int, n_classes: int) -> torch.Tensor:
    target = torch.randint(0, n_classes, (rows,), generator=torch.Generator().manual_seed(8))
    target[::3] = IGNORE  # ignored rows on every shard
    return target.to(ctx.device)


def _loss_fn(name: str, reduction: str):
    """The loss of (x, weight, target): cross_entropy of x as logits (weight unused), or of x @ weight.T."""
    if name == "cross_entropy":
        return lambda x, weight, target: liger.cross_entropy(x, target, None, IGNORE, 0.0, reduction)[0]
    return lambda x, weight, target: liger.fused_linear_cross_entropy(x, weight, target, None, None, IGNORE, 0.0,
                                                                      reduction)[0]  # fmt: skip


def loss(ctx: Context, name: str, reduction: str, x_at, weight_at=(R,), keeps: bool = True):
    """keeps: the loss is placed by the rows rule (Shard(0) for none, Partial for sum), and the gradients too."""
    ws = ctx.world_size
    rows, hidden, n_classes = 4 * ws, 8, 6 * ws
    x, weight = _inputs(ctx, 7, (rows, n_classes if name == "cross_entropy" else hidden), (n_classes, hidden))
    target = _targets(ctx, rows, n_classes)
    fn = _loss_fn(name, reduction)
    xs, wsd = _leaf(x), _leaf(weight)
    y = fn(xs, wsd, target)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(9)).to(ctx.device)
    y.backward(g)

    mesh = ctx.mesh(None)
    dx, dw = _dtensor(x, mesh, x_at), _dtensor(weight, mesh, weight_at, grad=name != "cross_entropy")
    dt = distribute_tensor(target, mesh, [Shard(0)] if x_at == (Shard(0),) else [R])
    dy = fn(dx, dw, dt)
    if keeps:
        _assert_placements(dy, [Shard(0) if reduction == "none" else Partial()], "loss")
    dy.backward(distribute_tensor(g, mesh, [Shard(0)] if dy.placements[0] == Shard(0) else [R]))
    assert_close(dy, y, "loss")
    assert_close(dx.grad, xs.grad, "grad_x")
    if keeps:
        _assert_placements(dx.grad, x_at, "grad_x")
    if name != "cross_entropy":
        assert_close(dw.grad, wsd.grad, "grad_weight")
        if keeps:
            _assert_partial_or(dw.grad, [R], "grad_weight")


def cases(world_size: int) -> list[tuple[str, Case]]:
    ws = world_size
    S = Shard
    p = functools.partial
    found: list[tuple[str, Case]] = [
        ("poly_norm/rows", p(poly_norm, shape=(2 * ws, 3, 32), placements=(S(0),))),
        ("poly_norm/middle_dim_uneven", p(poly_norm, shape=(2, 2 * ws - 1, 32), placements=(S(1),))),
        ("poly_norm/last_dim_redistributed", p(poly_norm, shape=(3, 2, 8 * ws), placements=(S(2),))),
        ("rms_norm/sequence", p(row_norm, name="rms_norm", shape=(2, 2 * ws + 1, 32), placements=(S(1),))),
        ("rms_norm/heads", p(row_norm, name="rms_norm_gemma", shape=(2, 3, 2 * ws, 16), placements=(S(2),))),
        ("layer_norm/sequence", p(row_norm, name="layer_norm", shape=(2, 2 * ws, 32), placements=(S(1),))),
        ("layer_norm/last_dim_redistributed", p(row_norm, name="layer_norm", shape=(3, 2, 8 * ws),
                                                placements=(S(2),))),  # fmt: skip
        ("rope/batch", p(rope, q_at=(S(0),), k_at=(S(0),), table="bsr")),
        ("rope/batch_shared_table", p(rope, q_at=(S(0),), k_at=(S(0),), table="1sr")),
        ("rope/heads_gqa", p(rope, q_at=(S(1),), k_at=(S(1),))),
        ("rope/heads_q_only", p(rope, q_at=(S(1),), k_at=(R,), rot=8)),
        ("rope/sequence_table_replicated", p(rope, q_at=(S(2),), k_at=(S(2),))),
        ("rope/sequence_table_sharded", p(rope, q_at=(S(2),), k_at=(S(2),), table_at=(S(0),))),
        ("rope/sequence_uneven_partial_rotary", p(rope, q_at=(S(2),), k_at=(S(2),), seq=2 * ws + 1, rot=8)),
        ("rope/batch_table_sharded", p(rope, q_at=(S(0),), k_at=(S(0),), table="bsr", table_at=(S(0),))),
        (
            "rope/sequence_compiled",
            p(rope, q_at=(S(2),), k_at=(S(2),), table_at=(S(0),), seq=2 * ws + 1, compiled=True),
        ),  # fmt: skip
        ("rope_/batch", p(rope_in_place, q_at=(S(0),), k_at=(S(0),), table="bsr")),
        ("rope_/heads", p(rope_in_place, q_at=(S(1),), k_at=(S(1),))),
        ("rope_/sequence", p(rope_in_place, q_at=(S(2),), k_at=(S(2),), table_at=(S(0),))),
        ("rope_/mismatch_refused", rope_in_place_refuses),
        ("group_norm/batch_3d", p(group_norm, shape=(2 * ws, 8, 6), num_groups=4, placements=(S(0),))),
        ("group_norm/batch_4d", p(group_norm, shape=(ws, 4, 3, 2), num_groups=2, placements=(S(0),))),
        (
            "group_norm/batch_2d_no_affine",
            p(group_norm, shape=(2 * ws, 8), num_groups=2, placements=(S(0),), affine=False),
        ),  # fmt: skip
        (
            "group_norm/channels_whole_groups",
            p(group_norm, shape=(3, 4 * ws, 5), num_groups=2 * ws, placements=(S(1),)),
        ),  # fmt: skip
        (
            "group_norm/channels_compiled",
            p(group_norm, shape=(3, 4 * ws, 5), num_groups=2 * ws, placements=(S(1),), compiled=True),
        ),  # fmt: skip
        (
            "group_norm/channels_no_affine",
            p(group_norm, shape=(2, 2 * ws, 3, 2), num_groups=ws, placements=(S(1),), affine=False),
        ),  # fmt: skip
        (
            "group_norm/channels_split_groups_redistributed",
            p(group_norm, shape=(2, 4 * ws, 5), num_groups=ws // 2, placements=(S(1),), keeps=False),
        ),  # fmt: skip
        (
            "group_norm/spatial_redistributed",
            p(group_norm, shape=(2, 4, 4 * ws), num_groups=2, placements=(S(2),), keeps=False),
        ),  # fmt: skip
    ]
    found += [
        ("swiglu/tensor_parallel", p(glu, name="swiglu", gate_at=(S(2),))),  # gate/up projections column-sharded
        ("geglu/sequence", p(glu, name="geglu", gate_at=(S(1),))),  # sequence parallel
        ("swiglu/batch", p(glu, name="swiglu", gate_at=(S(0),))),
        ("geglu/mismatch_redistributed", p(glu, name="geglu", gate_at=(S(2),), up_at=(S(1),), keeps=False)),
    ]
    found += [
        ("cross_entropy/rows_sum", p(loss, name="cross_entropy", reduction="sum", x_at=(S(0),))),
        ("cross_entropy/rows_none", p(loss, name="cross_entropy", reduction="none", x_at=(S(0),))),
        ("cross_entropy/mean_redistributed", p(loss, name="cross_entropy", reduction="mean", x_at=(S(0),),
                                               keeps=False)),  # fmt: skip
        ("cross_entropy/classes_redistributed", p(loss, name="cross_entropy", reduction="sum", x_at=(S(1),),
                                                  keeps=False)),  # fmt: skip
        ("fused_linear_cross_entropy/rows_sum", p(loss, name="fused_linear_cross_entropy", reduction="sum",
                                                  x_at=(S(0),))),  # fmt: skip
        ("fused_linear_cross_entropy/rows_none", p(loss, name="fused_linear_cross_entropy", reduction="none",
                                                   x_at=(S(0),))),  # fmt: skip
        ("fused_linear_cross_entropy/mean_redistributed", p(loss, name="fused_linear_cross_entropy",
                                                            reduction="mean", x_at=(S(0),), keeps=False)),  # fmt: skip
        ("fused_linear_cross_entropy/head_vocab_sharded", p(loss, name="fused_linear_cross_entropy",
                                                            reduction="sum", x_at=(S(0),), weight_at=(S(0),),
                                                            keeps=False)),  # fmt: skip
    ]
    if ws == 4:  # a 2-D (2, 2) mesh: the one-dim rules expanded
        found += [
            ("poly_norm/2d_mesh", p(poly_norm, shape=(4, 4, 16), placements=(S(0), S(1)), mesh_shape=(2, 2))),
            (
                "group_norm/2d_mesh_batch_channels",
                p(group_norm, shape=(4, 8, 3), num_groups=4, placements=(S(0), S(1)), mesh_shape=(2, 2)),
            ),  # fmt: skip
        ]
    return found
