"""torch.func for every ``torch.ops.liger`` op: vmap rules and forward-mode AD.

vmap (``torch.library.register_vmap``; without a rule torch falls back to a
slow per-sample loop with a warning):

* poly_norm, group_norm, rms_norm, layer_norm: the vmapped dim becomes extra
  rows / samples of one call when only the data is batched; batched
  parameters run per sample.
* rope, rope_backward: the vmapped dim is folded into the batch of one call
  when only q/k (dq/dk) are batched, (B, H, S, D) and no cu_seqlens
  (per-sample tables and position ids repeat for each vmapped sample);
  otherwise per sample.
* poly_norm_backward, group_norm_backward, rms_norm_backward,
  layer_norm_backward: per sample (dweight and dbias are
  sums over each sample's rows, which one call would add across samples).
* cross_entropy, fused_linear_cross_entropy, their backward ops and
  fused_linear_cross_entropy_with_grads: per sample (a mean or sum over one
  call would reduce across samples).
* rope_ (in place): per sample, on views of the batched q and k.
* swiglu, geglu and their backward ops (pointwise): one call on every
  tensor with the vmapped dim in front (an unbatched one expanded).

rope_ takes reverse-mode gradients (registrations/rope_inplace.py); forward-mode AD
through it raises naming it.

Forward-mode AD (torch.func.jvp / jacfwd, torch.autograd.forward_ad): the
op's Autograd kernel (registrations/autograd.py) routes dual tensors to its
Formula, whose ``jvp`` calls the rule registered here:

* rope, rope_backward are linear in q/k (dq/dk) and in (cos, sin) jointly:
  the tangent is the op itself on the tangents, plus the op on the primals
  with the tables' tangents; the kernels compute both.
* poly_norm, group_norm, rms_norm, layer_norm, the two losses, swiglu, geglu and their backward ops: the jvp of the op's
  pure-PyTorch reference (csrc_free_ops/<op>/reference.py) at the primals,
  in the reference's precision (float32 math, float64 for float64 data).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch.autograd import forward_ad

from csrc_free_ops.cross_entropy import launch as cross_entropy_launch
from csrc_free_ops.fused_linear_cross_entropy import launch as fused_linear_cross_entropy_launch
from csrc_free_ops.glu import reference as glu_reference
from csrc_free_ops.group_norm import reference as group_norm_reference
from csrc_free_ops.layer_norm import reference as layer_norm_reference
from csrc_free_ops.poly_norm import reference as poly_norm_reference
from csrc_free_ops.rms_norm import reference as rms_norm_reference
from csrc_free_ops.rope import RopeOptions
from registrations import rope_inplace  # noqa: F401  (rope_'s Autograd kernel, registered before _not_differentiable looks)
from registrations._library import JVP_RULES, LIB, register_autograd_by_reference
from registrations.cross_entropy import CROSS_ENTROPY, CROSS_ENTROPY_BACKWARD
from registrations.eager import below_autograd
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
from registrations.rope import ROPE, ROPE_, ROPE_BACKWARD, call
from registrations.transforms import any_tangent

# ---------------------------------------------------------------------------
# vmap


def _at(t, dim, i):
    return t if dim is None else t.select(dim, i)


def _per_sample(op: torch._ops.OpOverload, options: dict | None = None) -> Callable:
    """A vmap rule calling op once per sample and stacking each output (None
    stays None); ``options``: keyword-only arguments passed to every call."""

    def rule(info, in_dims, *args):
        outs = [
            op(*(_at(a, d, i) for a, d in zip(args, in_dims, strict=True)), **(options or {}))
            for i in range(info.batch_size)
        ]
        if outs[0] is None:  # in place: the samples were written through their views
            return None, None
        if not isinstance(outs[0], tuple):
            return torch.stack(outs), 0
        stacked = tuple(None if o[0] is None else torch.stack(o) for o in zip(*outs, strict=True))
        return stacked, tuple(None if o is None else 0 for o in stacked)

    return rule


def _front(t: torch.Tensor, dim: int | None, size: int) -> torch.Tensor:
    """t with the vmapped dim first (expanded to ``size`` if t is not batched)."""
    return t.expand(size, *t.shape) if dim is None else t.movedim(dim, 0)


def _batched_data_only(*positions: int) -> Callable[[tuple], bool]:
    """in_dims -> whether only the arguments at ``positions`` are batched."""
    return lambda in_dims: all(d is None for i, d in enumerate(in_dims) if i not in positions)


def _poly_norm_vmap(info, in_dims, x, weight, bias, eps):
    if not _batched_data_only(0)(in_dims):
        return _per_sample(POLY_NORM)(info, in_dims, x, weight, bias, eps)
    return POLY_NORM(x.movedim(in_dims[0], 0), weight, bias, eps), 0


def _group_norm_vmap(info, in_dims, x, num_groups, weight, bias, eps, activation):
    if not _batched_data_only(0)(in_dims):
        return _per_sample(GROUP_NORM, {"activation": activation})(info, in_dims, x, num_groups, weight, bias, eps)
    xb = x.movedim(in_dims[0], 0)
    y = GROUP_NORM(xb.reshape(-1, *xb.shape[2:]), num_groups, weight, bias, eps, activation=activation)
    return y.reshape(xb.shape), 0


def _group_norm_backward_vmap(info, in_dims, grad_out, x, num_groups, weight, bias, eps, activation):
    return _per_sample(GROUP_NORM_BACKWARD, {"activation": activation})(
        info, in_dims, grad_out, x, num_groups, weight, bias, eps
    )


def _rms_norm_vmap(info, in_dims, x, weight, eps, offset, casting_mode):
    options = {"offset": offset, "casting_mode": casting_mode}
    if not _batched_data_only(0)(in_dims):
        return _per_sample(RMS_NORM, options)(info, in_dims, x, weight, eps)
    return RMS_NORM(x.movedim(in_dims[0], 0), weight, eps, **options), 0


def _rms_norm_backward_vmap(info, in_dims, grad_out, x, weight, eps, offset, casting_mode):
    options = {"offset": offset, "casting_mode": casting_mode}
    return _per_sample(RMS_NORM_BACKWARD, options)(info, in_dims, grad_out, x, weight, eps)


def _layer_norm_vmap(info, in_dims, x, weight, bias, eps):
    if not _batched_data_only(0)(in_dims):
        return _per_sample(LAYER_NORM)(info, in_dims, x, weight, bias, eps)
    return LAYER_NORM(x.movedim(in_dims[0], 0), weight, bias, eps), 0


ROPE_POSITIONAL = 6  # q, k, cos, sin, position_ids, cu_seqlens; then pairs, mrope_section, mrope_interleaved


def _keywords(options: RopeOptions) -> dict:
    """The keyword-only options, for per-sample calls (the index tensors go positionally: they may be vmapped)."""
    return {"pairs": options.pairs, "mrope_section": options.mrope_section,
            "mrope_interleaved": options.mrope_interleaved}  # fmt: skip


def _rope_vmap(op: torch._ops.OpOverload) -> Callable:
    def rule(info, in_dims, q, k, cos, sin, *schema_options):
        options = RopeOptions(*schema_options)
        position_ids, cu_seqlens = options.position_ids, options.cu_seqlens
        per_sample = _per_sample(op, _keywords(options))
        in_dims = in_dims[:ROPE_POSITIONAL]
        if not _batched_data_only(0, 1)(in_dims) or cu_seqlens is not None:
            return per_sample(info, in_dims, q, k, cos, sin, position_ids, cu_seqlens)
        n = info.batch_size
        qb = None if q is None else _front(q, in_dims[0], n)
        kb = None if k is None else _front(k, in_dims[1], n)
        front = qb if qb is not None else kb
        if front.dim() != 5:  # packed (T, H, D) tokens: one sequence per call
            return per_sample(info, in_dims, q, k, cos, sin, position_ids, cu_seqlens)
        batch = front.shape[1]

        def fold(t):  # (n, B, ...) -> (n*B, ...)
            return None if t is None else t.reshape(n * batch, *t.shape[2:])

        def table(t):  # per-sample gathered tables (B, S, R) repeat for each vmapped sample; shared ones broadcast
            if position_ids is None and t.dim() == 3 and t.shape[0] != 1:
                return fold(t.expand(n, *t.shape))
            return t

        mrope = options.mrope_section is not None

        def ids(t):  # per-sample position ids, (B, S) or M-RoPE's (3, B, S), repeat likewise
            if t is None or t.dim() != (3 if mrope else 2) or t.shape[-2] == 1:
                return t
            if mrope:
                return t.unsqueeze(1).expand(3, n, *t.shape[1:]).reshape(3, n * batch, t.shape[-1])
            return fold(t.expand(n, *t.shape))

        folded = options._replace(position_ids=ids(position_ids))
        out_q, out_k = call(op, fold(qb), fold(kb), table(cos), table(sin), folded)
        outs = (None if out_q is None else out_q.reshape(qb.shape), None if out_k is None else out_k.reshape(kb.shape))
        return outs, tuple(None if o is None else 0 for o in outs)

    return rule


def _rope_inplace_vmap(info, in_dims, q, k, cos, sin, *schema_options):
    options = RopeOptions(*schema_options)
    return _per_sample(ROPE_, _keywords(options))(
        info, in_dims[:ROPE_POSITIONAL], q, k, cos, sin, options.position_ids, options.cu_seqlens
    )


def _pointwise_vmap(op: torch._ops.OpOverload) -> Callable:
    """Every tensor (all of one shape) with the vmapped dim in front; one call."""

    def rule(info, in_dims, *tensors):
        out = op(*(_front(t, d, info.batch_size) for t, d in zip(tensors, in_dims, strict=True)))
        return out, (tuple(0 for _ in out) if isinstance(out, tuple) else 0)

    return rule


VMAP_RULES: dict[torch._ops.OpOverload, Callable] = {
    POLY_NORM: _poly_norm_vmap,
    POLY_NORM_BACKWARD: _per_sample(POLY_NORM_BACKWARD),
    ROPE: _rope_vmap(ROPE),
    ROPE_BACKWARD: _rope_vmap(ROPE_BACKWARD),
    ROPE_: _rope_inplace_vmap,
    GROUP_NORM: _group_norm_vmap,
    GROUP_NORM_BACKWARD: _group_norm_backward_vmap,
    CROSS_ENTROPY: _per_sample(CROSS_ENTROPY),
    CROSS_ENTROPY_BACKWARD: _per_sample(CROSS_ENTROPY_BACKWARD),
    **{op: _pointwise_vmap(op) for unit in GATED_UNITS.values() for op in (unit.forward, unit.backward)},
    **{unit.backward_: _per_sample(unit.backward_) for unit in GATED_UNITS.values()},
    FUSED_LINEAR_CROSS_ENTROPY: _per_sample(FUSED_LINEAR_CROSS_ENTROPY),
    FUSED_LINEAR_CROSS_ENTROPY_BACKWARD: _per_sample(FUSED_LINEAR_CROSS_ENTROPY_BACKWARD),
    FUSED_LINEAR_CROSS_ENTROPY_WITH_GRADS: _per_sample(FUSED_LINEAR_CROSS_ENTROPY_WITH_GRADS),
    RMS_NORM: _rms_norm_vmap,
    RMS_NORM_BACKWARD: _rms_norm_backward_vmap,
    LAYER_NORM: _layer_norm_vmap,
    LAYER_NORM_BACKWARD: _per_sample(LAYER_NORM_BACKWARD),
}

# ---------------------------------------------------------------------------
# Forward-mode AD


def _tangent(t, like):
    return torch.zeros_like(like) if t is None else t


def _rope_jvp(op: torch._ops.OpOverload) -> Callable:
    def rule(primals, tangents):
        q, k, cos, sin, *schema_options = primals
        tq, tk, tcos, tsin = tangents[:4]
        options = RopeOptions(*schema_options)

        def rotate(x, y, c, s):
            return call(op, x, y, c, s, options)

        def zero_if_absent(t, like):
            return None if like is None else _tangent(t, like)

        out_q, out_k = rotate(zero_if_absent(tq, q), zero_if_absent(tk, k), cos, sin)
        if tcos is not None or tsin is not None:
            dq, dk = rotate(q, k, _tangent(tcos, cos), _tangent(tsin, sin))
            out_q = None if out_q is None else out_q + dq
            out_k = None if out_k is None else out_k + dk
        return out_q, out_k

    return rule


def _by_reference(reference: Callable) -> Callable:
    """The jvp of ``reference`` (same arguments and outputs as the op) at the
    primals: the reference run on dual tensors of the forward-AD level that
    asked (the float primals detached, each with its tangent; integer ones,
    such as class targets, as they are), so forward AD
    differentiates it as it would any PyTorch code."""

    def rule(primals, tangents):
        # Autograd turns forward AD off while it runs a Function's jvp; the reference needs it on.
        with forward_ad._set_fwd_grad_enabled(True):
            # contiguous: a primal or tangent may be an expanded view (e.g. the ones of sum's
            # backward), and a dual tensor needs memory of its own
            args = [
                forward_ad.make_dual(p.detach().contiguous(), _tangent(t, p).contiguous())
                if isinstance(p, torch.Tensor) and p.is_floating_point()
                else p
                for p, t in zip(primals, tangents, strict=True)
            ]
            out = reference(*args)
            if isinstance(out, tuple):
                return tuple(None if o is None else _output_tangent(o) for o in out)
            return _output_tangent(out)

    return rule


def _output_tangent(out: torch.Tensor) -> torch.Tensor:
    tangent = forward_ad.unpack_dual(out).tangent
    return torch.zeros_like(out) if tangent is None else tangent


def _loss_only(rule: Callable) -> Callable:
    """A loss op's rule without tangents for its z_loss and lse (not differentiable); any outputs after
    those three (the with-grads op's gradients) keep theirs."""

    def loss_rule(primals, tangents):
        out = rule(primals, tangents)
        return out[0], None, None, *out[3:]

    return loss_rule


JVP: dict[torch._ops.OpOverload, Callable] = {
    POLY_NORM: _by_reference(poly_norm_reference.forward),
    POLY_NORM_BACKWARD: _by_reference(poly_norm_reference.backward),
    ROPE: _rope_jvp(ROPE),
    ROPE_BACKWARD: _rope_jvp(ROPE_BACKWARD),
    GROUP_NORM: _by_reference(group_norm_reference.forward),
    GROUP_NORM_BACKWARD: _by_reference(group_norm_reference.backward),
    CROSS_ENTROPY: _loss_only(_by_reference(cross_entropy_launch.reference_forward)),
    CROSS_ENTROPY_BACKWARD: _by_reference(cross_entropy_launch.reference_backward),
    **{
        op: _by_reference(functools.partial(reference, activation=unit.activation))
        for unit in GATED_UNITS.values()
        for op, reference in ((unit.forward, glu_reference.forward), (unit.backward, glu_reference.backward))
    },
    FUSED_LINEAR_CROSS_ENTROPY: _loss_only(_by_reference(fused_linear_cross_entropy_launch.reference_forward)),
    FUSED_LINEAR_CROSS_ENTROPY_BACKWARD: _by_reference(fused_linear_cross_entropy_launch.reference_backward),
    FUSED_LINEAR_CROSS_ENTROPY_WITH_GRADS: _loss_only(
        _by_reference(fused_linear_cross_entropy_launch.reference_forward_with_grads)
    ),
    RMS_NORM: _by_reference(rms_norm_reference.forward),
    RMS_NORM_BACKWARD: _by_reference(rms_norm_reference.backward),
    LAYER_NORM: _by_reference(layer_norm_reference.forward),
    LAYER_NORM_BACKWARD: _by_reference(layer_norm_reference.backward),
}


def _with_defaults(op: torch._ops.OpOverload, rule: Callable) -> Callable:
    """rule called with every schema argument in order (the dispatcher leaves
    out trailing positional defaults and passes keyword-only arguments by
    name, those at their default left out); in_dims cover the positional ones."""
    arguments = op._schema.arguments
    positional = [a for a in arguments if not a.kwarg_only]
    keyword = [a for a in arguments if a.kwarg_only]

    def complete(info, in_dims, *args, **kwargs):
        tail = positional[len(args) :]
        rest = (*(a.default_value for a in tail), *(kwargs.get(a.name, a.default_value) for a in keyword))
        return rule(info, (*in_dims, *(None,) * len(tail)), *args, *rest)

    return complete


def _differentiable(op: torch._ops.OpOverload, reference: Callable) -> None:
    """A backward op without an Autograd kernel (group_norm_backward today) is made
    differentiable through its reference, so that double backward and
    forward-over-reverse reach its Formula instead of dropping the gradient."""
    if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Autograd"):
        register_autograd_by_reference(op, reference)


# The in-place ops, which have no forward-mode rule: tangents reaching them raise.
WITHOUT_JVP: set[torch._ops.OpOverload] = set()


def _not_differentiable(op: torch._ops.OpOverload, why: str, instead: str) -> None:
    """An op without gradients (rope_, the glu ops' in-place backwards) raises, naming itself and
    ``why`` it has none, when reverse- or forward-mode AD reaches it: without an Autograd kernel
    the kernels' writes would pass tangents and gradients through untouched.  Registered only if
    the op has no Autograd kernel yet."""
    WITHOUT_JVP.add(op)
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Autograd"):
        return
    name = op._schema.name.replace("::", ".")

    def autograd_kernel(*args):
        if (torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)) or (
            forward_ad._current_level >= 0 and any_tangent(args)
        ):
            raise NotImplementedError(
                f"{name} is not differentiable ({why}), but an input requires grad or carries a forward-mode "
                f"tangent; use {instead}"
            )
        return below_autograd(op, args)

    LIB.impl(op._schema.name.split("::", 1)[1], autograd_kernel, "Autograd")


_differentiable(GROUP_NORM_BACKWARD, group_norm_reference.backward)
_not_differentiable(
    ROPE_, "it writes in place, for inference and KV caches",
    "liger.rope (out of place), whose gradients and tangents flow to q and k",
)  # fmt: skip
for _name, _unit in GATED_UNITS.items():
    _not_differentiable(_unit.backward_, "it writes the gradients over gate and up", f"liger.{_name}_backward")
for _op, _rule in VMAP_RULES.items():
    torch.library.register_vmap(_op, _with_defaults(_op, _rule), lib=LIB)
JVP_RULES.update(JVP)
