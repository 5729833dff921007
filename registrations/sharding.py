"""DTensor sharding rules of every ``torch.ops.liger`` op and backward op.

Mechanism (works alike on torch 2.11 and 2.13, whose sources for it are
the same):

* ``torch.distributed.tensor.experimental.register_sharding`` for every op
  whose local call is the global call on local shards: poly_norm(_backward),
  rope(_backward) and group_norm(_backward).  It is the public API for custom
  ops.  A rule lists acceptable shardings over one mesh dimension (output
  placements, input placements); DTensor expands them to N-D meshes, picks
  the cheapest for the inputs at hand and redistributes the inputs to it.
  Inputs in no listed sharding (e.g. poly_norm's x sharded on its last dim)
  are redistributed to a listed one, so the answer is right, never wrong.
* A DTensor op handler (``DTensor._op_dispatcher._custom_op_handlers``, the
  hook torch's own convolution uses; DTensor's C++ dispatch consults it
  first in both versions) where the local call needs different arguments:
  - group_norm(_backward) sharded on channels: each shard holds whole groups
    and must be called with the number of groups it holds.  The handler runs
    DTensor's normal propagation with the rule below and only rewrites
    ``num_groups`` for the local call to local channels / channels per
    group.  (torch 2.13 has a scalar-argument adjuster for aten's
    group_norm, torch 2.11 has none; ``torch.library.register_torch_dispatch``
    is not consulted for DTensor since its dispatch moved to C++.)
  - rope_ (in place): q and k cannot be redistributed (the op writes into
    them), so the handler accepts the placements they have when rope allows
    them (below), brings cos/sin to match, rotates the local shards in place,
    and raises ValueError naming the placements otherwise.

Rules are keyed by the schema's argument names, so they read arguments
passed by position or keyword alike.  A tensor argument a rule does not
know (an argument added to an op later) leaves only the fully replicated
sharding: right, never wrong, until the rule learns it.

Per op, on one mesh dimension (R = Replicate, S(d) = Shard(d), P = Partial sum):
* poly_norm: x S(d) for any d but the last, weight/bias R -> y S(d).
  Backward: grad_out, x S(d) -> dx S(d), dweight/dbias P.
* rms_norm, layer_norm: the same row rule (x S(d) for any d but the last,
  weight/bias R; backward dweight/dbias P, None where absent): sequence
  parallel shards the rows' sequence dim, tensor parallel the heads of
  per-head norms (Qwen3's q/k norms over head_dim, x (B, S, heads,
  head_dim) S(2)).  A norm over a sharded last dim (OLMo2's over the whole
  projection under tensor parallel) is redistributed to whole rows.
* rope / rope_backward, q/k (B, H, S, D): both S(0) (batch; cos/sin S(0)
  when they have a batch dim of size > 1, else R); S(1) on q, k or both
  (heads, any head counts: each head is rotated alone; cos/sin R); both S(2)
  (sequence; cos/sin S on their sequence dim, the second to last).  Outputs
  keep q's and k's placements.  Packed tokens (T, H, D): S(0) is the
  sequence axis, S(1) the heads.  With position_ids, the (max_pos, R) tables
  are R and position_ids follows q/k's batch (when it has a batch dim of size
  > 1) and sequence dims; with cu_seqlens (each token's sequence start is
  global) only the heads axis is sharded, cu_seqlens R.  k None: q alone.
* group_norm: x S(0) (batch, any rank), weight/bias R -> y S(0); backward
  dx S(0), dweight/dbias P.  x S(1) (channels) with weight/bias S(0) when
  every shard holds whole groups, i.e. num_groups divisible by the mesh's
  size (so any split of the channels over any of its dims is even) -> y S(1),
  dweight/dbias S(0).  Other channel splits and spatial shards are
  redistributed.
* rope_: per mesh dim, (q, k) placed as rope allows above, or Partial
  sum/avg (rotation is linear), the other R.
* cross_entropy: logits and target S(0) (rows), weight R -> lse S(0), loss
  and z_loss S(0) for reduction none, P for sum; mean only replicated (it
  divides by the count over all rows).  Backward likewise, grad_loss S(0)
  (none) or R (sum).  Logits sharded over the classes are redistributed
  (gathered): no vocabulary-parallel loss.
* swiglu, geglu, geglu_exact (pointwise): gate and up both S(d), any d -> y S(d) (tensor
  parallel: gate_proj and up_proj column-sharded alike give S(-1); sequence
  parallel: S on a leading dim).  Backward: grad_out, gate, up S(d) ->
  dgate, dup S(d).  Gate and up placed differently are redistributed.
  The in-place backwards (swiglu_backward_, geglu_backward_) take
  grad_out, gate and up already placed alike, without Partial; otherwise
  ValueError (in place, nothing can be redistributed).
* fused_linear_cross_entropy: x and target S(0), weight, bias and
  ce_weight R -> as cross_entropy; backward grad_x S(0) (R when the mask
  leaves it out: an empty tensor), grad_weight and grad_bias P; the
  with-grads op as both (its gradients are for a unit grad_loss, each
  shard's for its own rows).  An LM head sharded over the
  vocabulary (weight S(0), as tensor parallelism's ColwiseParallel leaves
  it) is gathered first: right, but without vocabulary-parallel memory
  savings.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor.experimental import register_sharding
from torch.utils import _pytree as pytree

from registrations.cross_entropy import CROSS_ENTROPY, CROSS_ENTROPY_BACKWARD
from registrations.fused_linear_cross_entropy import (
    FUSED_LINEAR_CROSS_ENTROPY,
    FUSED_LINEAR_CROSS_ENTROPY_BACKWARD,
    FUSED_LINEAR_CROSS_ENTROPY_WITH_GRADS,
)
from registrations.glu import GATED_UNITS
from registrations.group_norm import GROUP_NORM, GROUP_NORM_BACKWARD
from registrations.layer_norm import LAYER_NORM, LAYER_NORM_BACKWARD
from registrations.poly_norm import POLY_NORM, POLY_NORM_BACKWARD
from registrations.rms_norm import RMS_NORM, RMS_NORM_BACKWARD
from registrations.rope import ROPE, ROPE_, ROPE_BACKWARD

R = Replicate()
P = Partial()
# Placement lists: (outputs, inputs in DTensor's order: positional arguments, then keywords).
Sharding = tuple[list, list]


def _arguments(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[tuple[str, object]]:
    """(schema name, value) of each argument, in the order DTensor lists input placements."""
    names = [a.name for a in op._schema.arguments]
    return list(zip(names, args, strict=False)) + list(kwargs.items())


def _inputs(arguments: list[tuple[str, object]], placement: dict[str, object]) -> list | None:
    """The input placements: placement[name] for each tensor argument, None
    for the others; None if a tensor argument has no placement given."""
    out = []
    for name, value in arguments:
        if isinstance(value, DTensorSpec):
            if name not in placement:
                return None
            out.append(placement[name])
        else:
            out.append(None)
    return out


def _rule(
    op: torch._ops.OpOverload, shardings: Callable[[dict[str, object]], list[tuple[list, dict[str, object]]]]
) -> Callable:
    """A register_sharding rule from ``shardings(arguments by name)`` ->
    [(output placements, {argument name: placement})].  The fully replicated
    sharding is always offered; a sharding naming too few tensor arguments is
    dropped (an argument the rule does not know)."""

    def rule(*args, **kwargs) -> list[Sharding]:
        arguments = _arguments(op, args, kwargs)
        by_name = dict(arguments)
        found = [_replicated(op, arguments, by_name)]
        for outputs, placement in shardings(by_name):
            inputs = _inputs(arguments, placement)
            if inputs is not None:
                found.append((outputs, inputs))
        return found

    rule.__name__ = f"{op._schema.name.split('::')[1]}_sharding"
    return rule


def _replicated(op: torch._ops.OpOverload, arguments: list[tuple[str, object]], by_name: dict) -> Sharding:
    outputs = [R if _present(o) else None for o in _OUTPUTS[op](by_name)]
    return outputs, [R if isinstance(v, DTensorSpec) else None for _, v in arguments]


def _present(output: object) -> bool:
    """An _OUTPUTS entry: True or the argument the output goes with (a spec) where it exists."""
    return output is not None and output is not False


def _loss_grads(a: dict) -> list[bool]:
    """Which of the fused loss's (grad_x, grad_weight, grad_bias) output_mask asks for (no bias, no grad_bias)."""
    return [m and (i != 2 or a.get("bias") is not None) for i, m in enumerate(a["output_mask"])]


# Which outputs exist, per op, from its arguments: True or the argument an output goes with where it
# exists, None or False where the op returns None (_present).
_OUTPUTS: dict[torch._ops.OpOverload, Callable[[dict], list]] = {
    POLY_NORM: lambda a: [True],
    POLY_NORM_BACKWARD: lambda a: [True, True, True],
    ROPE: lambda a: [True, a.get("k")],
    ROPE_BACKWARD: lambda a: [True, a.get("dk")],
    GROUP_NORM: lambda a: [True],
    GROUP_NORM_BACKWARD: lambda a: [True, a.get("weight"), a.get("bias")],
    CROSS_ENTROPY: lambda a: [True, True, True],
    CROSS_ENTROPY_BACKWARD: lambda a: [True],
    **{unit.forward: lambda a: [True] for unit in GATED_UNITS.values()},
    **{unit.backward: lambda a: [True, True] for unit in GATED_UNITS.values()},
    FUSED_LINEAR_CROSS_ENTROPY: lambda a: [True, True, True],
    # the backward op's grad_x is an empty tensor where the mask leaves it out
    FUSED_LINEAR_CROSS_ENTROPY_BACKWARD: lambda a: [True, *_loss_grads(a)[1:]],
    FUSED_LINEAR_CROSS_ENTROPY_WITH_GRADS: lambda a: [True, True, True, *_loss_grads(a)],
    RMS_NORM: lambda a: [True],
    RMS_NORM_BACKWARD: lambda a: [True, a.get("weight")],
    LAYER_NORM: lambda a: [True],
    LAYER_NORM_BACKWARD: lambda a: [True, a.get("weight"), a.get("bias")],
}


# ---------------------------------------------------------------------------
# poly_norm: rows are independent; the norm runs over the last dim.


def _poly_norm(a: dict) -> list:
    return [([Shard(d)], {"x": Shard(d), "weight": R, "bias": R}) for d in range(a["x"].ndim - 1)]


def _poly_norm_backward(a: dict) -> list:
    return [([Shard(d), P, P], {"grad_out": Shard(d), "x": Shard(d), "weight": R}) for d in range(a["x"].ndim - 1)]


# ---------------------------------------------------------------------------
# swiglu, geglu: pointwise over gate and up of one shape.


def _glu(a: dict) -> list:
    return [([Shard(d)], {"gate": Shard(d), "up": Shard(d)}) for d in range(a["gate"].ndim)]


def _glu_backward(a: dict) -> list:
    placed = ({"grad_out": Shard(d), "gate": Shard(d), "up": Shard(d)} for d in range(a["gate"].ndim))
    return [([p["gate"], p["up"]], p) for p in placed]


# rms_norm, layer_norm: rows are independent; the norm runs over the last dim.


def _row_norm(a: dict) -> list:
    return [([Shard(d)], {"x": Shard(d), "weight": R, "bias": R}) for d in range(a["x"].ndim - 1)]


def _row_norm_backward(op: torch._ops.OpOverload) -> Callable[[dict], list]:
    def shardings(a: dict) -> list:
        outputs = [P if _present(o) else None for o in _OUTPUTS[op](a)[1:]]
        inputs = {"weight": R, "bias": R}
        return [([Shard(d), *outputs], {"grad_out": Shard(d), "x": Shard(d), **inputs}) for d in range(a["x"].ndim - 1)]

    return shardings


# ---------------------------------------------------------------------------
# rope: q/k (B, H, S, D) or packed (T, H, D); cos/sin gathered, (S, R), (1, S, R)
# or (B, S, R) ((T, R), (1, T, R) packed), or (max_pos, R) tables looked up at
# position_ids ((B, S), (1, S), (S,); M-RoPE (3, ...)) or by cu_seqlens.
BATCH, HEADS, SEQ = "batch", "heads", "seq"
# (axis, q's placement, k's placement) per layout
_ROPE_AXES = {
    4: ((BATCH, Shard(0), Shard(0)), (SEQ, Shard(2), Shard(2)),
        (HEADS, Shard(1), Shard(1)), (HEADS, Shard(1), R), (HEADS, R, Shard(1))),
    3: ((SEQ, Shard(0), Shard(0)), (HEADS, Shard(1), Shard(1)), (HEADS, Shard(1), R), (HEADS, R, Shard(1))),
}  # fmt: skip


def _table(table: DTensorSpec, axis: str):
    """A gathered cos/sin's placement when q and k are sharded on ``axis``."""
    if axis == SEQ:
        return Shard(table.ndim - 2)
    if axis == BATCH and table.ndim >= 3 and table.shape[table.ndim - 3] != 1:
        return Shard(table.ndim - 3)
    return R


def _position_ids(ids: DTensorSpec, axis: str, mrope: bool):
    """position_ids' placement when q and k are sharded on ``axis``."""
    if axis == SEQ:
        return Shard(ids.ndim - 1)
    batched = ids.ndim == (3 if mrope else 2) and ids.shape[ids.ndim - 2] != 1
    return Shard(ids.ndim - 2) if axis == BATCH and batched else R


def _rope_aux(a: dict, axis: str) -> dict | None:
    """Placements of cos, sin, position_ids and cu_seqlens for q/k sharded on
    ``axis``; None where that axis cannot be sharded locally."""
    ids, cu_seqlens = a.get("position_ids"), a.get("cu_seqlens")
    if cu_seqlens is not None:
        return {"cos": R, "sin": R, "cu_seqlens": R} if axis == HEADS else None
    if ids is not None:
        return {"cos": R, "sin": R, "position_ids": _position_ids(ids, axis, a.get("mrope_section") is not None)}
    return {"cos": _table(a["cos"], axis), "sin": _table(a["sin"], axis)}


def _rope_like(first: str, second: str) -> Callable[[dict], list]:
    def shardings(a: dict) -> list:
        x, y = a.get(first), a.get(second)
        found = []
        for axis, px, py in _ROPE_AXES[(x if x is not None else y).ndim]:
            aux = _rope_aux(a, axis)
            if aux is not None:
                outputs = [None if x is None else px, None if y is None else py]
                found.append((outputs, {first: px, second: py, **aux}))
        return found

    return shardings


# ---------------------------------------------------------------------------
# group_norm: x (N, C, *); statistics per (sample, group).


def _whole_groups(x: DTensorSpec, num_groups: int) -> bool:
    """Any even split of the channels over any of the mesh's dims leaves whole groups on every shard."""
    return num_groups % x.mesh.size() == 0


def _group_norm(a: dict) -> list:
    found = [([Shard(0)], {"x": Shard(0), "weight": R, "bias": R})]
    if _whole_groups(a["x"], a["num_groups"]):
        found.append(([Shard(1)], {"x": Shard(1), "weight": Shard(0), "bias": Shard(0)}))
    return found


def _group_norm_backward(a: dict) -> list:
    def outs(dx, dparam):
        return [dx, dparam if a.get("weight") is not None else None, dparam if a.get("bias") is not None else None]

    found = [(outs(Shard(0), P), {"grad_out": Shard(0), "x": Shard(0), "weight": R, "bias": R})]
    if _whole_groups(a["x"], a["num_groups"]):
        channels = {"grad_out": Shard(1), "x": Shard(1), "weight": Shard(0), "bias": Shard(0)}
        found.append((outs(Shard(1), Shard(0)), channels))
    return found


def _local_num_groups(op: torch._ops.OpOverload) -> Callable:
    """DTensor op handler: DTensor's propagation with the registered rule, then
    the local call with num_groups = the groups the local channels hold."""
    names = [a.name for a in op._schema.arguments]
    x_at, groups_at = names.index("x"), names.index("num_groups")
    dispatcher = DTensor._op_dispatcher

    def handler(op_call, args, kwargs):
        op_info = dispatcher.unwrap_to_op_info(op_call, args, kwargs)
        dispatcher.sharding_propagator.propagate(op_info)
        sharding = op_info.output_sharding
        if not op_info.compute_mesh._is_current_rank_part_of_mesh():
            raise NotImplementedError(f"{op_call}: a rank outside the DTensor's mesh is not supported")
        if sharding.needs_redistribute:
            dispatcher.redistribute_local_args(
                op_info, sharding.redistribute_schema, sharding.use_val_from_redistribute_schema
            )
        local_args = op_info.local_args
        if op_info.args_tree_spec is not None:
            local_args = pytree.tree_unflatten(list(local_args), op_info.args_tree_spec)
        local_args = list(local_args)
        x_spec, num_groups = op_info.schema.args_schema[x_at], local_args[groups_at]
        channels = x_spec.shape[1]
        local_args[groups_at] = local_args[x_at].shape[1] * num_groups // channels
        result = op_call(*local_args, **op_info.local_kwargs)
        return dispatcher.wrap(result, sharding.output_spec)

    return handler


# ---------------------------------------------------------------------------
# cross_entropy: rows are independent; the softmax runs over the classes (the last dim).
# A mean divides by the count over every row, which no shard knows: only replicated.


def _loss_rows(a: dict) -> list:
    """(loss placement, z-loss placement) for rows sharded on S(0), None for mean."""
    reduction = a.get("reduction", "mean")
    if reduction == "mean":
        return []
    loss = Shard(0) if reduction == "none" else P
    return [loss]


def _cross_entropy(a: dict) -> list:
    return [([loss, loss, Shard(0)], {"logits": Shard(0), "target": Shard(0), "weight": R}) for loss in _loss_rows(a)]


def _cross_entropy_backward(a: dict) -> list:
    rows = {"logits": Shard(0), "target": Shard(0), "lse": Shard(0), "weight": R}
    return [([Shard(0)], {"grad_loss": loss if loss == Shard(0) else R, **rows}) for loss in _loss_rows(a)]


def _fused_linear_cross_entropy(a: dict) -> list:
    rows = {"x": Shard(0), "target": Shard(0), "weight": R, "bias": R, "ce_weight": R}
    return [([loss, loss, Shard(0)], rows) for loss in _loss_rows(a)]


def _loss_grad_placements(a: dict) -> list:
    """grad_x's rows S(0), grad_weight and grad_bias P (sums over the shards' rows); None where not asked for."""
    return [p if present else None for p, present in zip((Shard(0), P, P), _loss_grads(a), strict=True)]


def _fused_linear_cross_entropy_backward(a: dict) -> list:
    rows = {"x": Shard(0), "target": Shard(0), "lse": Shard(0), "weight": R, "bias": R, "ce_weight": R}
    grad_x, *param_grads = _loss_grad_placements(a)
    outputs = [R if grad_x is None else grad_x, *param_grads]  # grad_x left out: a replicated empty tensor
    return [(outputs, {"grad_loss": loss if loss == Shard(0) else R, **rows}) for loss in _loss_rows(a)]


def _fused_linear_cross_entropy_with_grads(a: dict) -> list:
    rows = {"x": Shard(0), "target": Shard(0), "weight": R, "bias": R, "ce_weight": R}
    return [([loss, loss, Shard(0), *_loss_grad_placements(a)], rows) for loss in _loss_rows(a)]


# ---------------------------------------------------------------------------
# rope_ (in place): q and k keep their placements.


ROPE_OPTIONS = ("pairs", "mrope_section", "mrope_interleaved")


def _inplace_axis(i: int, pq, pk, ndim: int) -> str | None:
    """The rope axis q's and k's placements on mesh dim i shard, None where
    they are replicated or a linear Partial (rotation is linear); ValueError
    for what rope_ cannot rotate in place."""
    pair = (pq, pk)
    for axis, px, py in _ROPE_AXES[ndim]:
        if pair == (px, py):
            return axis
    if all(p == R or (isinstance(p, Partial) and p.reduce_op in ("sum", "avg")) for p in pair):
        return None
    raise ValueError(
        f"liger.rope_: q placed {pq!r} and k placed {pk!r} on mesh dim {i}; in place, both must be Shard(0) "
        "(batch) or Shard(2) (sequence), Shard(1) (heads) or Replicate each, or Partial sum/avg with the "
        "other Replicate (packed (T, H, D): Shard(0) tokens, Shard(1) heads). Redistribute q and k first, "
        "or use liger.rope (out of place), which redistributes"
    )


def _rope_inplace(op_call, args, kwargs):
    arguments = dict(_arguments(ROPE_, args, kwargs))
    unknown = set(arguments) - {"q", "k", "cos", "sin", "position_ids", "cu_seqlens", *ROPE_OPTIONS}
    if unknown:
        raise NotImplementedError(f"liger.rope_ on DTensors: no sharding rule for argument(s) {sorted(unknown)}")
    q, k = arguments.get("q"), arguments.get("k")
    data = q if q is not None else k
    aux_names = [n for n in ("cos", "sin", "position_ids", "cu_seqlens") if arguments.get(n) is not None]
    for name in ("q", "k", *aux_names):
        t = arguments.get(name)
        if t is None:
            continue
        if not isinstance(t, DTensor):
            raise TypeError(f"liger.rope_: q is a DTensor but {name} is a {type(t).__name__}; pass DTensors for all")
        if t.device_mesh != data.device_mesh:
            raise ValueError(f"liger.rope_: {name} is on another device mesh than q")
    mesh = data.device_mesh
    specs = {n: arguments[n]._spec for n in aux_names}
    options = {n: arguments[n] for n in ROPE_OPTIONS if n in arguments}
    placements: dict[str, list] = {n: [] for n in aux_names}
    for i, (pq, pk) in enumerate(zip((q if q is not None else k).placements, (k if k is not None else q).placements,
                                     strict=True)):  # fmt: skip
        axis = _inplace_axis(i, pq, pk, data.ndim)
        aux = {n: R for n in aux_names} if axis is None else _rope_aux({**specs, **options}, axis)
        if aux is None:
            raise ValueError(
                f"liger.rope_: with cu_seqlens only the heads can be sharded (sequence starts are global); q and k "
                f"are placed {pq!r} and {pk!r} on mesh dim {i}"
            )
        for n in aux_names:
            placements[n].append(aux[n])
    with torch.no_grad():
        local = {n: arguments[n].redistribute(mesh, placements[n]).to_local() for n in aux_names}
        op_call(
            None if q is None else q.to_local(), None if k is None else k.to_local(), local["cos"], local["sin"],
            local.get("position_ids"), local.get("cu_seqlens"), **options,
        )  # fmt: skip


def _glu_in_place(op: torch._ops.OpOverload) -> Callable:
    """swiglu_backward_ / geglu_backward_ on DTensors: elementwise and in place, so grad_out, gate and
    up must already share one mesh and one placement (no Partial: the activation is not linear);
    each rank then writes its own shards."""
    name = op._schema.name.replace("::", ".")

    def handler(op_call, args, kwargs):
        arguments = dict(_arguments(op, args, kwargs))
        tensors = [arguments[n] for n in ("grad_out", "gate", "up")]
        if not all(isinstance(t, DTensor) for t in tensors):
            raise TypeError(f"{name}: pass DTensors for all of grad_out, gate and up, or none")
        first = tensors[0]
        if any(t.device_mesh != first.device_mesh or t.placements != first.placements for t in tensors) or any(
            isinstance(p, Partial) for p in first.placements
        ):
            raise ValueError(
                f"{name}: in place, grad_out, gate and up must share one device mesh and one placement without "
                f"Partial; got {[t.placements for t in tensors]}. Redistribute them first, or use the out-of-place "
                "backward op, which redistributes"
            )
        with torch.no_grad():
            op_call(*(t.to_local() for t in tensors))

    return handler


# ---------------------------------------------------------------------------

RULES: dict[torch._ops.OpOverload, Callable] = {
    POLY_NORM: _rule(POLY_NORM, _poly_norm),
    POLY_NORM_BACKWARD: _rule(POLY_NORM_BACKWARD, _poly_norm_backward),
    ROPE: _rule(ROPE, _rope_like("q", "k")),
    ROPE_BACKWARD: _rule(ROPE_BACKWARD, _rope_like("dq", "dk")),
    GROUP_NORM: _rule(GROUP_NORM, _group_norm),
    GROUP_NORM_BACKWARD: _rule(GROUP_NORM_BACKWARD, _group_norm_backward),
    CROSS_ENTROPY: _rule(CROSS_ENTROPY, _cross_entropy),
    CROSS_ENTROPY_BACKWARD: _rule(CROSS_ENTROPY_BACKWARD, _cross_entropy_backward),
    **{unit.forward: _rule(unit.forward, _glu) for unit in GATED_UNITS.values()},
    **{unit.backward: _rule(unit.backward, _glu_backward) for unit in GATED_UNITS.values()},
    FUSED_LINEAR_CROSS_ENTROPY: _rule(FUSED_LINEAR_CROSS_ENTROPY, _fused_linear_cross_entropy),
    FUSED_LINEAR_CROSS_ENTROPY_BACKWARD: _rule(
        FUSED_LINEAR_CROSS_ENTROPY_BACKWARD, _fused_linear_cross_entropy_backward
    ),
    FUSED_LINEAR_CROSS_ENTROPY_WITH_GRADS: _rule(
        FUSED_LINEAR_CROSS_ENTROPY_WITH_GRADS, _fused_linear_cross_entropy_with_grads
    ),
    RMS_NORM: _rule(RMS_NORM, _row_norm),
    RMS_NORM_BACKWARD: _rule(RMS_NORM_BACKWARD, _row_norm_backward(RMS_NORM_BACKWARD)),
    LAYER_NORM: _rule(LAYER_NORM, _row_norm),
    LAYER_NORM_BACKWARD: _rule(LAYER_NORM_BACKWARD, _row_norm_backward(LAYER_NORM_BACKWARD)),
}
HANDLERS: dict[torch._ops.OpOverload, Callable] = {
    GROUP_NORM: _local_num_groups(GROUP_NORM),
    GROUP_NORM_BACKWARD: _local_num_groups(GROUP_NORM_BACKWARD),
    ROPE_: _rope_inplace,
    **{unit.backward_: _glu_in_place(unit.backward_) for unit in GATED_UNITS.values()},
}

for _op, _fn in RULES.items():
    register_sharding(_op)(_fn)
DTensor._op_dispatcher._custom_op_handlers.update(HANDLERS)
