"""Sharding propagation of the DTensor rules (registrations/sharding.py) in
one process: a fake process group of 4 ranks and meta tensors, so only the
decisions are checked (placements, and which collectives run), for every op
and backward op, eagerly and under torch.compile.  The values are checked in
real processes by tests/test_dtensor.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.distributed.fake_pg import FakeStore

from registrations import sharding

R = Replicate()
WORLD = 4
liger = torch.ops.liger


@pytest.fixture(scope="module")
def mesh():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    try:
        yield init_device_mesh("cpu", (WORLD,))
    finally:
        dist.destroy_process_group()


def _dt(mesh, shape, placements, grad=True) -> DTensor:
    t = distribute_tensor(torch.empty(shape, device="meta"), mesh, list(placements))
    return t.requires_grad_() if grad else t


def _comms(fn) -> tuple[object, int]:
    with CommDebugMode() as comm:
        out = fn()
    return out, comm.get_total_counts()


def _backward(mesh, outs) -> int:
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = [_dt(mesh, o.shape, o.placements, grad=False) for o in outs]
    return _comms(lambda: torch.autograd.backward(list(outs), grads))[1]


# ---------------------------------------------------------------------------
# poly_norm


@pytest.mark.parametrize("dim", [0, 1])
def test_poly_norm_rows_need_no_communication(mesh, dim):
    x = _dt(mesh, (8, 8, 32), [Shard(dim)])
    w, b = _dt(mesh, (3,), [R]), _dt(mesh, (1,), [R])
    y, n = _comms(lambda: liger.poly_norm(x, w, b, 1e-6))
    assert (y.placements, n) == ((Shard(dim),), 0)
    assert _backward(mesh, y) == 0
    assert x.grad.placements == (Shard(dim),)
    assert isinstance(w.grad.placements[0], Partial) and isinstance(b.grad.placements[0], Partial)


def test_poly_norm_last_dim_is_redistributed(mesh):
    """The norm runs over the last dim: a shard there must move, never be normalized alone."""
    x = _dt(mesh, (8, 8, 32), [Shard(2)])
    y, n = _comms(lambda: liger.poly_norm(x, _dt(mesh, (3,), [R]), _dt(mesh, (1,), [R]), 1e-6))
    assert n > 0 and y.placements != (Shard(2),)


# ---------------------------------------------------------------------------
# rms_norm, layer_norm: sequence parallel (S(1) of (B, S, H)) and per-head norms under tensor parallel
# (S(2) of (B, S, heads, head_dim), Qwen3's q/k norms)

ROW_NORMS = {
    "rms_norm": lambda x, w, b: liger.rms_norm(x, w, 1e-6, offset=1.0, casting_mode="gemma"),
    "rms_norm_no_weight": lambda x, w, b: liger.rms_norm(x, None, 1e-6),
    "layer_norm": lambda x, w, b: liger.layer_norm(x, w, b, 1e-5),
    "layer_norm_weight_only": lambda x, w, b: liger.layer_norm(x, w, None, 1e-5),
}


@pytest.mark.parametrize("name", ROW_NORMS)
@pytest.mark.parametrize(("shape", "dim"), [((8, 8, 32), 0), ((8, 8, 32), 1), ((2, 8, 8, 16), 2)])
def test_row_norms_rows_need_no_communication(mesh, name, shape, dim):
    x = _dt(mesh, shape, [Shard(dim)])
    w, b = _dt(mesh, shape[-1:], [R]), _dt(mesh, shape[-1:], [R])
    y, n = _comms(lambda: ROW_NORMS[name](x, w, b))
    assert (y.placements, n) == ((Shard(dim),), 0)
    assert _backward(mesh, y) == 0
    assert x.grad.placements == (Shard(dim),)
    for param in (w, b):
        assert param.grad is None or isinstance(param.grad.placements[0], Partial)


@pytest.mark.parametrize("name", ROW_NORMS)
def test_row_norms_last_dim_is_redistributed(mesh, name):
    """OLMo2's norm over a whole projection sharded by tensor parallel: the row must be gathered."""
    x = _dt(mesh, (8, 8, 32), [Shard(2)])
    y, n = _comms(lambda: ROW_NORMS[name](x, _dt(mesh, (32,), [R]), _dt(mesh, (32,), [R])))
    assert n > 0 and y.placements != (Shard(2),)


# ---------------------------------------------------------------------------
# rope: q (B, Hq, S, D), k (B, Hk, S, D)


@pytest.mark.parametrize(
    "q_at,k_at,table,table_at",
    [
        (Shard(0), Shard(0), (8, 12, 16), R),  # batch; per-sample tables are sharded locally
        (Shard(0), Shard(0), (8, 12, 16), Shard(0)),
        (Shard(0), Shard(0), (1, 12, 16), R),  # batch; shared tables stay replicated
        (Shard(1), Shard(1), (12, 16), R),  # heads (GQA 8/4)
        (Shard(1), R, (12, 16), R),
        (Shard(2), Shard(2), (12, 16), R),  # sequence; tables sharded locally
        (Shard(2), Shard(2), (12, 16), Shard(0)),
        (Shard(2), Shard(2), (1, 12, 8), Shard(1)),  # partial rotary
    ],
)
def test_rope_axes_need_no_communication(mesh, q_at, k_at, table, table_at):
    q, k = _dt(mesh, (8, 8, 12, 16), [q_at]), _dt(mesh, (8, 4, 12, 16), [k_at])
    cos, sin = _dt(mesh, table, [table_at], grad=False), _dt(mesh, table, [table_at], grad=False)
    (oq, ok), n = _comms(lambda: liger.rope(q, k, cos, sin))
    assert (oq.placements, ok.placements, n) == ((q_at,), (k_at,), 0)
    assert _backward(mesh, (oq, ok)) == 0
    assert (q.grad.placements, k.grad.placements) == ((q_at,), (k_at,))


def test_rope_head_dim_is_redistributed(mesh):
    q, k = _dt(mesh, (8, 8, 12, 16), [Shard(3)]), _dt(mesh, (8, 4, 12, 16), [Shard(3)])
    cos, sin = _dt(mesh, (12, 16), [R], grad=False), _dt(mesh, (12, 16), [R], grad=False)
    (oq, _), n = _comms(lambda: liger.rope(q, k, cos, sin))
    assert n > 0 and oq.placements != (Shard(3),)


def test_rope_in_place_keeps_placements(mesh):
    q, k = _dt(mesh, (8, 8, 12, 16), [Shard(2)], grad=False), _dt(mesh, (8, 4, 12, 16), [Shard(2)], grad=False)
    cos, sin = _dt(mesh, (12, 16), [R], grad=False), _dt(mesh, (12, 16), [R], grad=False)
    assert _comms(lambda: liger.rope_(q, k, cos, sin)) == (None, 0)
    assert q.placements == k.placements == (Shard(2),)


def test_rope_in_place_refuses_what_it_cannot_redistribute(mesh):
    cos, sin = _dt(mesh, (12, 16), [R], grad=False), _dt(mesh, (12, 16), [R], grad=False)
    q, k = _dt(mesh, (8, 8, 12, 16), [Shard(1)], grad=False), _dt(mesh, (8, 4, 12, 16), [Shard(2)], grad=False)
    with pytest.raises(ValueError, match=r"liger\.rope_: q placed Shard\(dim=1\) and k placed Shard\(dim=2\)"):
        liger.rope_(q, k, cos, sin)
    q3 = _dt(mesh, (8, 8, 12, 16), [Shard(3)], grad=False)
    with pytest.raises(ValueError, match=r"liger\.rope_"):
        liger.rope_(q3, _dt(mesh, (8, 4, 12, 16), [Shard(3)], grad=False), cos, sin)


# ---------------------------------------------------------------------------
# group_norm: x (N, C, *)


@pytest.mark.parametrize(
    "shape,num_groups,at,param_grad",
    [
        ((8, 8, 6), 4, Shard(0), Partial()),  # batch
        ((8, 8, 3, 2), 2, Shard(0), Partial()),  # batch, 4-D
        ((2, 16, 6), 8, Shard(1), Shard(0)),  # channels, 2 whole groups per rank
        ((2, 8, 6), 4, Shard(1), Shard(0)),  # channels, 1 group per rank
    ],
)
def test_group_norm_batch_and_whole_group_channels_need_no_communication(mesh, shape, num_groups, at, param_grad):
    x = _dt(mesh, shape, [at])
    w, b = _dt(mesh, (shape[1],), [R]), _dt(mesh, (shape[1],), [R])
    y, n = _comms(lambda: liger.group_norm(x, num_groups, w, b, 1e-5))
    assert (y.placements, n) == ((at,), 0)
    assert _backward(mesh, y) == 0
    assert x.grad.placements == (at,)
    assert w.grad.placements == b.grad.placements == (param_grad,)


@pytest.mark.parametrize("at", [Shard(0), Shard(1)])
def test_group_norm_silu_keeps_the_placements(mesh, at):
    """The activation is elementwise after the statistics: the same rules hold."""
    x = _dt(mesh, (8, 8, 6), [at])
    w, b = _dt(mesh, (8,), [R]), _dt(mesh, (8,), [R])
    y, n = _comms(lambda: liger.group_norm(x, 4, w, b, 1e-5, activation="silu"))
    assert (y.placements, n) == ((at,), 0)
    assert _backward(mesh, y) == 0
    assert x.grad.placements == (at,)


@pytest.mark.parametrize("shape,num_groups,at", [((2, 12, 6), 6, Shard(1)), ((2, 8, 6), 2, Shard(1)),
                                                  ((2, 8, 8), 4, Shard(2))])  # fmt: skip
def test_group_norm_split_groups_and_spatial_shards_are_redistributed(mesh, shape, num_groups, at):
    """A group split across ranks (6 or 2 groups on 4 ranks) or a spatial shard must move."""
    x = _dt(mesh, shape, [at])
    y, n = _comms(lambda: liger.group_norm(x, num_groups, None, None, 1e-5))
    assert n > 0 and y.placements != (at,)


def test_group_norm_on_a_2d_mesh(mesh):
    mesh2 = init_device_mesh("cpu", (2, 2))
    x = _dt(mesh2, (4, 8, 6), [Shard(0), Shard(1)])
    w, b = _dt(mesh2, (8,), [R, R]), _dt(mesh2, (8,), [R, R])
    y, n = _comms(lambda: liger.group_norm(x, 4, w, b, 1e-5))
    assert (y.placements, n) == ((Shard(0), Shard(1)), 0)
    assert _backward(mesh2, y) == 0
    assert isinstance(w.grad.placements[0], Partial) and w.grad.placements[1] == Shard(0)


# ---------------------------------------------------------------------------
# swiglu, geglu, geglu_exact: pointwise


@pytest.mark.parametrize("name", ["swiglu", "geglu", "geglu_exact"])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_glu_matching_shards_need_no_communication(mesh, name, dim):
    """Tensor parallel (gate/up column-sharded: the last dim) and sequence parallel pass through."""
    gate, up = _dt(mesh, (4, 8, 32), [Shard(dim)]), _dt(mesh, (4, 8, 32), [Shard(dim)])
    y, n = _comms(lambda: getattr(liger, name)(gate, up))
    assert (y.placements, n) == ((Shard(dim),), 0)
    assert _backward(mesh, y) == 0
    assert gate.grad.placements == up.grad.placements == (Shard(dim),)


def test_glu_mismatched_shards_are_redistributed(mesh):
    gate, up = _dt(mesh, (4, 8, 32), [Shard(2)]), _dt(mesh, (4, 8, 32), [Shard(1)])
    _, n = _comms(lambda: liger.swiglu(gate, up))
    assert n > 0


@pytest.mark.parametrize("name", ["swiglu", "geglu", "geglu_exact"])
def test_glu_in_place_backward_writes_each_shard_and_refuses_mixed_placements(mesh, name):
    op = getattr(liger, name + "_backward_")
    torch.manual_seed(0)
    # this rank's (rank 0's) shards: the fake process group holds no other
    local = [torch.randn(2, 12) for _ in range(3)]
    placed = [DTensor.from_local(t.clone(), mesh, [Shard(0)], run_check=False) for t in local]
    assert _comms(lambda: op(*placed)) == (None, 0)
    op(*local)
    for got, want in zip(placed[1:], local[1:], strict=True):
        assert torch.equal(got.to_local(), want)
    mixed = [DTensor.from_local(t, mesh, [p], run_check=False) for t, p in zip(local, (Shard(0), Shard(1), Shard(0)),
                                                                                strict=True)]  # fmt: skip
    with pytest.raises(ValueError, match=rf"liger\.{name}_backward_: in place, grad_out, gate and up must share"):
        op(*mixed)


# ---------------------------------------------------------------------------
# The rules themselves


def _spec(mesh, shape, placement) -> DTensorSpec:
    meta = TensorMeta(torch.Size(shape), torch.empty(shape, device="meta").stride(), torch.float32)
    return DTensorSpec(mesh, (placement,), tensor_meta=meta)


def test_an_argument_a_rule_does_not_know_leaves_only_replication(mesh):
    """A tensor argument added to an op later must not be sharded by guess."""
    q, k = _spec(mesh, (8, 8, 12, 16), Shard(2)), _spec(mesh, (8, 4, 12, 16), Shard(2))
    cos = sin = _spec(mesh, (12, 16), R)
    rule = sharding.RULES[liger.rope.default]
    assert len(rule(q, k, cos, sin)) > 1
    only = rule(q, k, cos, sin, added_later=_spec(mesh, (8, 12), Shard(1)))
    assert only == [([R, R], [R, R, R, R, R])]


def test_an_output_the_op_leaves_out_has_no_placement_in_any_sharding(mesh):
    """Every sharding, the fully replicated one included, places None where the op returns None:
    torch 2.11's DTensor refuses a placement without an output to go with it."""
    x, head, rows = _spec(mesh, (8, 8), Shard(0)), _spec(mesh, (12, 8), R), _spec(mesh, (8,), Shard(0))
    options = (-100, 0.0, "sum", 0.0, None)  # rows sharded: a mean has only the replicated sharding
    for op, args, absent in (
        (liger.fused_linear_cross_entropy_backward.default,
         (_spec(mesh, (), R), x, head, rows, rows, None, None, *options, [True, True, False]), (2,)),
        (liger.fused_linear_cross_entropy_backward.default,
         (_spec(mesh, (), R), x, head, rows, rows, _spec(mesh, (12,), R), None, *options, [True, False, False]),
         (1, 2)),
        (liger.fused_linear_cross_entropy_with_grads.default,
         (x, head, rows, None, None, *options, [True, True, True]), (5,)),
        (liger.rope.default, (_spec(mesh, (8, 8, 12, 16), Shard(0)), None, _spec(mesh, (12, 16), R),
                              _spec(mesh, (12, 16), R)), (1,)),
    ):  # fmt: skip
        shardings = sharding.RULES[op](*args)
        assert len(shardings) > 1, op
        for outputs, _ in shardings:
            assert [i for i, p in enumerate(outputs) if p is None] == list(absent), (op, outputs)


@pytest.mark.parametrize(
    "q_at,ids_shape,ids_at,mrope",
    [
        (Shard(0), (8, 12), Shard(0), None),  # batch: per-sample ids sharded with it
        (Shard(0), (1, 12), R, None),  # batch: shared ids stay replicated
        (Shard(2), (8, 12), Shard(1), None),  # sequence
        (Shard(2), (12,), Shard(0), None),
        (Shard(1), (8, 12), R, None),  # heads
        (Shard(0), (3, 8, 12), Shard(1), [2, 3, 3]),  # M-RoPE streams
        (Shard(2), (3, 8, 12), Shard(2), [2, 3, 3]),
    ],
)
def test_rope_position_ids_follow_q_and_k(mesh, q_at, ids_shape, ids_at, mrope):
    """Tables (max_pos, R) stay replicated; position ids shard with q/k's batch and sequence."""
    q, k = _dt(mesh, (8, 8, 12, 16), [q_at]), _dt(mesh, (8, 4, 12, 16), [q_at])
    cos, sin = _dt(mesh, (32, 16), [R], grad=False), _dt(mesh, (32, 16), [R], grad=False)
    ids = distribute_tensor(torch.zeros(ids_shape, dtype=torch.int64, device="meta"), mesh, [ids_at])
    options = {"pairs": "interleaved", "mrope_section": mrope}
    (oq, ok), n = _comms(lambda: liger.rope(q, k, cos, sin, ids, **options))
    assert (oq.placements, ok.placements, n) == ((q_at,), (q_at,), 0)
    assert _backward(mesh, (oq, ok)) == 0


def test_rope_packed_tokens_and_cu_seqlens(mesh):
    """Packed (T, H, D): tokens or heads sharded locally; with cu_seqlens only
    the heads (sequence starts are global), tokens are redistributed."""
    q, k = _dt(mesh, (16, 8, 16), [Shard(0)]), _dt(mesh, (16, 4, 16), [Shard(0)])
    cos, sin = _dt(mesh, (16, 16), [Shard(0)], grad=False), _dt(mesh, (16, 16), [Shard(0)], grad=False)
    (oq, _), n = _comms(lambda: liger.rope(q, k, cos, sin))
    assert (oq.placements, n) == ((Shard(0),), 0)
    table = _dt(mesh, (16, 16), [R], grad=False)
    cu_seqlens = distribute_tensor(torch.zeros(3, dtype=torch.int32, device="meta"), mesh, [R])
    qh, kh = _dt(mesh, (16, 8, 16), [Shard(1)]), _dt(mesh, (16, 4, 16), [Shard(1)])
    (oq, ok), n = _comms(lambda: liger.rope(qh, kh, table, table, None, cu_seqlens))
    assert (oq.placements, ok.placements, n) == ((Shard(1),), (Shard(1),), 0)
    (oq, _), n = _comms(lambda: liger.rope(q, k, table, table, None, cu_seqlens))
    assert n > 0 and oq.placements != (Shard(0),)
    with pytest.raises(ValueError, match=r"liger\.rope_: with cu_seqlens only the heads can be sharded"):
        liger.rope_(q.detach(), k.detach(), table, table, None, cu_seqlens)


def test_rope_single_tensor(mesh):
    k = _dt(mesh, (8, 4, 12, 16), [Shard(2)])
    cos, sin = _dt(mesh, (12, 16), [Shard(0)], grad=False), _dt(mesh, (12, 16), [Shard(0)], grad=False)
    (ok, none), n = _comms(lambda: liger.rope(k, None, cos, sin))
    assert none is None and (ok.placements, n) == ((Shard(2),), 0)
    assert _backward(mesh, ok) == 0
    assert _comms(lambda: liger.rope_(k.detach(), None, cos, sin)) == (None, 0)


def test_every_op_has_a_rule():
    ops = {getattr(torch.ops.liger, name).default for name in torch.ops.liger}
    assert ops == set(sharding.RULES) | set(sharding.HANDLERS)


# ---------------------------------------------------------------------------
# Under torch.compile: dynamo and AOT autograd trace the same decisions.


def test_rules_under_torch_compile(mesh):
    def step(x, w, q, k, cos, sin, xg, wg):
        y = liger.poly_norm(x, w, w[:1], 1e-6)
        oq, ok = liger.rope(q, k, cos, sin)
        yg = liger.group_norm(xg, 4, wg, wg, 1e-5)
        return y, oq, ok, yg

    torch._dynamo.reset()
    args = (
        _dt(mesh, (8, 6, 32), [Shard(0)]),
        _dt(mesh, (3,), [R]),
        _dt(mesh, (8, 8, 12, 16), [Shard(1)]),
        _dt(mesh, (8, 4, 12, 16), [Shard(1)]),
        _dt(mesh, (12, 16), [R], grad=False),
        _dt(mesh, (12, 16), [R], grad=False),
        _dt(mesh, (2, 8, 6), [Shard(1)]),
        _dt(mesh, (8,), [R]),
    )
    try:
        outs = torch.compile(step, backend="aot_eager", fullgraph=True, dynamic=True)(*args)
    finally:
        torch._dynamo.reset()
    assert [o.placements for o in outs] == [(Shard(0),), (Shard(1),), (Shard(1),), (Shard(1),)]
    assert _backward(mesh, tuple(outs)) == 0
    assert args[6].grad.placements == (Shard(1),) and args[7].grad.placements == (Shard(0),)
