"""torch.ops.liger.rope, rope_backward and rope_ (rotary position embedding).

rope(q, k, cos, sin, position_ids=None, cu_seqlens=None, *, pairs="halves",
     mrope_section=None, mrope_interleaved=False) -> (q_out, k_out)
    q: (B, Hq, S, D) and k: (B, Hkv, S, D), or packed tokens (T, Hq, D) and
    (T, Hkv, D); Hq and Hkv independent (GQA/MQA); any strides (HF's
    transposed (B, S, H, D) views are read in place).  k may be None: the
    single-tensor form rotates q alone, and k alone (a KV-cache append) is
    rope(k, None, ...); the second output is then None.  (q cannot be None:
    DTensor's sharding propagation needs the first output to be a Tensor.)
    R = cos.shape[-1], even, 2 <= R <= D: the first R dims of each head
    rotate, dims R..D pass through (partial rotary).
    Where each row's cos/sin come from:
      * default: cos, sin already gathered, (S, R), (1, S, R) or (B, S, R)
        ((T, R) or (1, T, R) for packed tokens);
      * position_ids (int32/int64, (B, S), (1, S) or (S,); (T,) or (1, T)
        packed): rows of (max_pos, R) tables, gathered in the kernel
        (packed sequences: ids restarting at each document);
      * cu_seqlens (int32/int64, (n + 1,), flash-attn's varlen boundaries,
        for packed tokens or B = 1): each token's offset in its sequence
        indexes the (max_pos, R) tables;
      * mrope_section [t, h, w] with position_ids (3, B, S), (3, 1, S) or
        (3, S): M-RoPE (Qwen2-VL sections; mrope_interleaved=True: the
        Qwen3-VL interleaving), t + h + w = R/2.
    pairs: "halves" (rotate_half: (x[p], x[p + R/2]); Llama, NeoX, Qwen),
    "interleaved" ((x[2p], x[2p+1]); GPT-J, GLM, Cohere), or
    "interleaved_to_halves" (reads interleaved pairs, writes halves;
    DeepSeek-V3's rope_interleave).  cos and sin are laid out like the
    output's rotary dims (what HF builds for each convention).
    Out-of-range positions: ValueError on the CPU paths; on GPU and NPU the
    table is never read out of bounds and such a row's rotated dims are NaN.
    q, k, cos and sin may each be float32, bfloat16, float16 or float64 (fp32
    tables with bf16 q and k is the AMP case), all on one device; math runs
    in float32, float64 when q or k is float64.  Each output keeps its
    input's dtype and memory layout (torch.empty_like).
    Gradients flow to q and k only: cos and sin get none, and if either
    requires grad when autograd records the op it raises ValueError
    instead of returning a wrong zero.
rope_backward(dq, dk, cos, sin, *, same options) -> (dq_in, dk_in)
    The transpose of the rotation (the inverse rotation for HF's tables);
    differentiable in dq and dk (its own backward is rope).
rope_(q, k, cos, sin, *, same options) -> ()
    rope in place on q and k (inference, KV-cache appends, and a training
    step's projections through liger_nn.apply_rotary_pos_emb where
    liger_nn.rope.rotates_in_place allows; q and k may be views, e.g. HF's
    transposed projections: autograd records the rotation on their
    bases).  It refuses q or
    k overlapping itself and q and k sharing any element, eagerly and while
    torch.compile traces.  Autograd treats it as torch's in-place ops: the
    version counters are bumped, a leaf that requires grad raises, a saved
    tensor it rotated makes backward raise, and otherwise gradients flow
    through the rotation (rope_backward) to the values q and k had before;
    views autograd forbids modifying in place (outputs of split/unbind,
    views made under no_grad) raise RuntimeError.  Forward-mode AD and gradients under torch.func transforms raise
    NotImplementedError naming rope_ (use rope).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.autograd import forward_ad

from csrc_free_ops.rope import RopeOptions, launch, reference
from registrations import _checks, overlap
from registrations._library import LIB, Entries, Prepare, call_from_backward, define_op, register_autograd

_OP = "liger.rope"
# position_ids and cu_seqlens are positional (with defaults): torch.library.register_vmap and
# custom_op take no keyword-only tensors.  The rest are keyword-only.
OPTIONS = "Tensor? position_ids=None, Tensor? cu_seqlens=None, *, str pairs='halves', int[]? mrope_section=None, " \
    "bool mrope_interleaved=False"  # fmt: skip
PAIRS = tuple(launch.PAIRS)
INDEX_DTYPES = (torch.int32, torch.int64)


def _check_options(op: str, cos, options: RopeOptions) -> None:
    position_ids, cu_seqlens, pairs, mrope_section, mrope_interleaved = options
    if pairs not in PAIRS:
        raise ValueError(f"{op}: pairs must be one of {', '.join(map(repr, PAIRS))}, got {pairs!r}")
    if position_ids is not None and cu_seqlens is not None:
        raise ValueError(f"{op}: pass position_ids or cu_seqlens, not both")
    for name, t in (("position_ids", position_ids), ("cu_seqlens", cu_seqlens)):
        if t is not None and t.dtype not in INDEX_DTYPES:
            raise TypeError(f"{op}: {name} must be int32 or int64, got {t.dtype}")
    if mrope_section is None:
        if mrope_interleaved:
            raise ValueError(f"{op}: mrope_interleaved=True needs mrope_section")
        return
    if position_ids is None:
        raise ValueError(f"{op}: mrope_section needs position_ids of shape (3, B, S), (3, 1, S) or (3, S)")
    rot = cos.shape[-1]
    if len(mrope_section) != 3 or any(s < 0 for s in mrope_section) or sum(mrope_section) != rot // 2:
        raise ValueError(
            f"{op}: mrope_section must be 3 non-negative sizes [t, h, w] summing to R/2 = {rot // 2}, "
            f"got {list(mrope_section)}"
        )


def _check_heads(op: str, names: tuple[str, str], q, k) -> tuple[str, torch.Tensor]:
    """q and k (either may be None): ranks and matching sizes; returns the first present (name, tensor)."""
    present = [(n, t) for n, t in zip(names, (q, k), strict=True) if t is not None]
    if not present:
        raise ValueError(f"{op}: {names[0]} and {names[1]} are both None; pass at least one")
    for name, t in present:
        if t.dim() not in (3, 4):
            raise ValueError(
                f"{op}: {name} must be 4-D (batch, heads, seq, head_dim) or 3-D packed tokens "
                f"(tokens, heads, head_dim), got shape {tuple(t.shape)}"
            )
    if len(present) == 2:
        (qn, qt), (kn, kt) = present
        if qt.dim() != kt.dim():
            raise ValueError(f"{op}: {qn} and {kn} must have the same rank, got {qt.dim()}-D and {kt.dim()}-D")
        dims = ((0, "batch size"), (2, "sequence length"), (3, "head_dim")) if qt.dim() == 4 else (
            (0, "token count"), (2, "head_dim"))  # fmt: skip
        for dim, what in dims:
            if qt.shape[dim] != kt.shape[dim]:
                raise ValueError(
                    f"{op}: {qn} and {kn} must have the same {what}, got {qt.shape[dim]} and {kt.shape[dim]}"
                )
    return present[0]


def _sizes(x: torch.Tensor) -> tuple[int, int, int]:
    """(batch, seq, head_dim); packed tokens are one sequence."""
    return (1, x.shape[0], x.shape[2]) if x.dim() == 3 else (x.shape[0], x.shape[2], x.shape[3])


def _check_gathered(op: str, cos: torch.Size, packed: bool, batch: int, seq: int) -> None:
    rank = len(cos)
    if packed:
        ok = rank == 2 or (rank == 3 and cos[0] == 1)
        if not ok:
            raise ValueError(f"{op}: cos/sin must have shape (T, R) or (1, T, R) for packed tokens, got {tuple(cos)}")
    elif rank not in (2, 3) or (rank == 3 and cos[0] != 1 and cos[0] != batch):
        raise ValueError(
            f"{op}: cos/sin must have shape (S, R), (1, S, R) or (B, S, R) with B={batch}, got {tuple(cos)}"
        )
    if cos[-2] != seq:
        raise ValueError(f"{op}: cos/sin have sequence length {cos[-2]} but q and k have {seq}")


def _check_position_ids(op: str, ids: torch.Size, mrope: bool, packed: bool, batch: int, seq: int) -> None:
    lead = (3,) if mrope else ()
    if packed:
        shapes = [(*lead, seq), (*lead, 1, seq)]
    else:
        shapes = [(*lead, batch, seq), (*lead, 1, seq), (*lead, seq)]
    if tuple(ids) not in shapes:
        wanted = " or ".join(str(s) for s in dict.fromkeys(shapes))
        raise ValueError(f"{op}: position_ids must have shape {wanted}, got {tuple(ids)}")


def _check_looked_up(op: str, cos, options: RopeOptions, packed: bool, batch: int, seq: int):
    position_ids, cu_seqlens, mrope = options.position_ids, options.cu_seqlens, options.mrope_section is not None
    if cos.dim() != 2 or cos.shape[0] < 1:
        raise ValueError(
            f"{op}: with position_ids or cu_seqlens, cos/sin are (max_pos, R) tables, got shape {tuple(cos.shape)}"
        )
    if position_ids is not None:
        _check_position_ids(op, position_ids.shape, mrope, packed, batch, seq)
        return
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError(f"{op}: cu_seqlens must be 1-D with at least 2 entries, got shape {tuple(cu_seqlens.shape)}")
    if batch != 1:
        raise ValueError(f"{op}: cu_seqlens needs packed tokens, (T, H, D) or batch 1, got batch {batch}")


# The argument descriptions _check has passed; a repeat skips its ~20 checks (rope's host cost).
_PASSED: set[tuple] = set()
_MAX_PASSED = 1024


def _described(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (t.shape, t.dtype, t.device)


def _check(op, q, k, cos, sin, options: RopeOptions, names=("q", "k")) -> None:
    """_check_uncached, skipped for arguments whose shapes, dtypes, devices and
    options passed it before (real sizes only: symbolic ones are not hashed)."""
    position_ids, cu_seqlens, pairs, mrope_section, mrope_interleaved = options
    key = (op, _described(q), _described(k), _described(cos), _described(sin), _described(position_ids),
           _described(cu_seqlens), pairs, None if mrope_section is None else tuple(mrope_section),
           mrope_interleaved)  # fmt: skip
    try:
        if key in _PASSED:
            return
    except TypeError:  # a SymInt size (torch.compile tracing): unhashable
        _check_uncached(op, q, k, cos, sin, options, names)
        return
    _check_uncached(op, q, k, cos, sin, options, names)
    if len(_PASSED) >= _MAX_PASSED:
        _PASSED.clear()
    _PASSED.add(key)


def _check_uncached(op, q, k, cos, sin, options: RopeOptions, names=("q", "k")) -> None:
    """Runs in every binding and the fake kernel: shapes, dtypes, devices, options."""
    position_ids, cu_seqlens = options.position_ids, options.cu_seqlens
    ref_name, ref = _check_heads(op, names, q, k)
    tensors = [(n, t) for n, t in zip(names, (q, k), strict=True) if t is not None] + [("cos", cos), ("sin", sin)]
    for name, t in tensors:
        _checks.check_float(op, name, t)
    indices = [(n, t) for n, t in (("position_ids", position_ids), ("cu_seqlens", cu_seqlens)) if t is not None]
    _checks.check_same_device(op, ref_name, ref, (*tensors, *indices))
    if cos.shape != sin.shape:
        raise ValueError(f"{op}: cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    _check_options(op, cos, options)
    batch, seq, head_dim = _sizes(ref)
    packed = ref.dim() == 3
    if position_ids is None and cu_seqlens is None:
        _check_gathered(op, cos.shape, packed, batch, seq)
    else:
        _check_looked_up(op, cos, options, packed, batch, seq)
    rot = cos.shape[-1]
    if rot % 2 != 0 or rot < 2 or rot > head_dim:
        raise ValueError(
            f"{op}: rotary dim R = cos.shape[-1] must be even and between 2 and head_dim={head_dim}, got {rot}"
        )


def _check_in_place(q: torch.Tensor | None, k: torch.Tensor | None) -> None:
    """Memory that in-place rotation would corrupt: exact on real and fake
    tensors (registrations/overlap.py)."""
    for name, t in (("q", q), ("k", k)):
        if t is not None and overlap.self_overlapping(t):
            raise ValueError(f"{_OP}_: {name} has internally overlapping memory (e.g. an expanded view)")
    if q is not None and k is not None and overlap.overlapping(q, k):
        raise ValueError(f"{_OP}_: q and k overlap in memory; rotating one in place would change the other")


# --- The schema boundary: each function the registration helper calls takes the schema's
# arguments in order (q, k, cos, sin, then the options in RopeOptions' order) and bundles the
# options into one RopeOptions right there.


def _check_rope(q, k, cos, sin, *schema_options) -> None:
    _check(_OP, q, k, cos, sin, RopeOptions(*schema_options))


def _check_rope_backward(dq, dk, cos, sin, *schema_options) -> None:
    _check(_OP + "_backward", dq, dk, cos, sin, RopeOptions(*schema_options), ("dq", "dk"))


def _check_rope_(q, k, cos, sin, *schema_options) -> None:
    _check(_OP + "_", q, k, cos, sin, RopeOptions(*schema_options))
    _check_in_place(q, k)


def _bundled(entry):
    """entry(q, k, cos, sin, options) as a binding that takes the schema's arguments."""

    def run(q, k, cos, sin, *schema_options):
        return entry(q, k, cos, sin, RopeOptions(*schema_options))

    return run


def call(op, q, k, cos, sin, options: RopeOptions):
    """op (rope, rope_backward or rope_) with ``options`` spread into the schema's arguments."""
    position_ids, cu_seqlens, pairs, mrope_section, mrope_interleaved = options
    return op(q, k, cos, sin, position_ids, cu_seqlens, pairs=pairs, mrope_section=mrope_section,
              mrope_interleaved=mrope_interleaved)  # fmt: skip


# --- Positions: checked against the tables where the values can be read
# without a device sync (the CPU bindings).  On GPU and NPU the kernel masks
# rows outside the table (NaN results, never an out-of-bounds read).


def check_positions(op: str, q, k, cos, position_ids, cu_seqlens) -> None:
    """position_ids within [0, max_pos); cu_seqlens from 0 to the token count,
    non-decreasing, no sequence longer than the tables."""
    max_pos = cos.shape[0]
    if position_ids is not None and position_ids.numel() > 0:
        lo, hi = int(position_ids.min()), int(position_ids.max())
        if lo < 0 or hi >= max_pos:
            raise ValueError(
                f"{op}: position_ids must lie in [0, {max_pos}) (the rows of cos/sin), got values from {lo} to {hi}"
            )
    if cu_seqlens is not None:
        tokens = _sizes(q if q is not None else k)[1]
        bounds = cu_seqlens.long()
        lengths = bounds[1:] - bounds[:-1]
        if int(bounds[0]) != 0 or int(bounds[-1]) != tokens or bool((lengths < 0).any()):
            raise ValueError(f"{op}: cu_seqlens must rise from 0 to the token count {tokens}, got {bounds.tolist()}")
        longest = int(lengths.max())
        if longest > max_pos:
            raise ValueError(
                f"{op}: a sequence of cu_seqlens has {longest} tokens, more than the {max_pos} rows of cos/sin"
            )


def _on_cpu(op: str, entry):
    """A CPU binding (schema arguments): entry(q, k, cos, sin, options) after the position
    check (CPU values read freely)."""

    def run(q, k, cos, sin, *schema_options):
        options = RopeOptions(*schema_options)
        check_positions(op, q, k, cos, options.position_ids, options.cu_seqlens)
        return entry(q, k, cos, sin, options)

    return run


def _on_cpu_prepared(op: str, prepare):
    """A CPU binding's prepared form (schema arguments): the prepared run after the position
    check (it reads values: every call)."""

    def prepare_on_cpu(q, k, cos, sin, *schema_options):
        prepared = prepare(q, k, cos, sin, RopeOptions(*schema_options))

        def run(q, k, cos, sin, position_ids, cu_seqlens, *fixed):
            check_positions(op, q, k, cos, position_ids, cu_seqlens)
            return prepared(q, k, cos, sin, position_ids, cu_seqlens, *fixed)

        return run

    return prepare_on_cpu


def _fake(q, k, cos, sin, *options):
    return (None if q is None else torch.empty_like(q)), (None if k is None else torch.empty_like(k))


def _fake_(q, k, cos, sin, *options) -> None:
    return None


ROPE = define_op(
    f"rope(Tensor q, Tensor? k, Tensor cos, Tensor sin, {OPTIONS}) -> (Tensor, Tensor?)",
    check=_check_rope,
    fake=_fake,
    entries=Entries(
        cuda=_bundled(launch.cuda_forward),
        npu=_bundled(launch.npu_forward),
        interpreted=_on_cpu(_OP, launch.cuda_forward),
        reference=_on_cpu(_OP, reference.forward),
    ),
    prepare=Prepare(
        cuda=_bundled(launch.prepare_cuda_forward), interpreted=_on_cpu_prepared(_OP, launch.prepare_cuda_forward)
    ),
)
ROPE_BACKWARD = define_op(
    f"rope_backward(Tensor dq, Tensor? dk, Tensor cos, Tensor sin, {OPTIONS}) -> (Tensor, Tensor?)",
    check=_check_rope_backward,
    fake=_fake,
    entries=Entries(
        cuda=_bundled(launch.cuda_backward),
        npu=_bundled(launch.npu_backward),
        interpreted=_on_cpu(_OP + "_backward", launch.cuda_backward),
        reference=_on_cpu(_OP + "_backward", reference.backward),
    ),
    prepare=Prepare(
        cuda=_bundled(launch.prepare_cuda_backward),
        interpreted=_on_cpu_prepared(_OP + "_backward", launch.prepare_cuda_backward),
    ),
)
ROPE_ = define_op(
    f"rope_(Tensor(a!) q, Tensor(b!)? k, Tensor cos, Tensor sin, {OPTIONS}) -> ()",
    check=_check_rope_,
    fake=_fake_,
    traceable=False,  # in place: torch.compile functionalizes the opaque op (auto_functionalized)
    entries=Entries(
        cuda=_bundled(launch.cuda_forward_),
        npu=_bundled(launch.npu_forward_),
        interpreted=_on_cpu(_OP + "_", launch.cuda_forward_),
        reference=_on_cpu(_OP + "_", reference.forward_),
    ),
)


# --- Autograd


def _refuse_table_grad(op: str, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if cos.requires_grad or sin.requires_grad:
        raise ValueError(
            f"{op}: cos and sin get no gradient, but one of them requires grad; "
            "pass cos.detach() and sin.detach() (HF's rotary tables need none)"
        )


# Autograd works at the schema: its formulas call the ops, which take the schema's arguments.


def _save(ctx, cos, sin, position_ids, cu_seqlens, *fixed) -> None:
    """The tensors through save_for_backward, the other options (RopeOptions' order) on ctx."""
    ctx.save_for_backward(cos, sin, position_ids, cu_seqlens)
    ctx.fixed_options = fixed


def _no_table_grad(op: str):
    def setup_context(ctx, inputs, output) -> None:
        _, _, cos, sin, *schema_options = inputs
        _refuse_table_grad(op, cos, sin)
        _save(ctx, cos, sin, *schema_options)

    return setup_context


def _transpose_with(op, ctx, dq, dk, needs=None):
    """(gradient of q, of k, None for every other argument) by ``op`` on the
    incoming gradients, for the inputs that need one (``needs``: (q, k),
    default the first two of ctx.needs_input_grad)."""
    cos, sin, position_ids, cu_seqlens = ctx.saved_tensors
    need_q, need_k = ctx.needs_input_grad[:2] if needs is None else needs
    dq, dk = (dq if need_q else None), (dk if need_k else None)
    if dq is None and dk is None:
        return (None,) * 9
    args = (cos, sin, position_ids, cu_seqlens, *ctx.fixed_options)
    if dq is None:  # k's gradient alone: first, as rope(k, None) takes k alone (the first tensor is not optional)
        gk, _ = call_from_backward(op, dk, None, *args)
        return (None, gk) + (None,) * 7
    gq, gk = call_from_backward(op, dq, dk, *args)
    return (gq, gk) + (None,) * 7


def _rope_grad(ctx, dq, dk):
    return _transpose_with(ROPE_BACKWARD, ctx, dq, dk)


def _rope_backward_grad(ctx, ddq, ddk):
    return _transpose_with(ROPE, ctx, ddq, ddk)


register_autograd(ROPE, _rope_grad, setup_context=_no_table_grad(_OP))
register_autograd(ROPE_BACKWARD, _rope_backward_grad, setup_context=_no_table_grad(_OP + "_backward"))


# --- rope_ under autograd: torch's in-place semantics
#
# ADInplaceOrView bumps the version counters (as torch.library.custom_op does
# for ops that mutate), so a saved tensor rotated afterwards fails backward's
# version check, grad mode or not.  The Autograd kernel records the rotation
# as an autograd.Function on the *bases* of q and k (a tensor that is no view
# is its own base), which it marks dirty: a leaf requiring grad raises, the
# bases take the rotation into their history (gradient: rope_backward on the
# regions q and k cover), and q, k, as views of their bases, see it through
# autograd's view replay.  Recording it on q and k themselves would fail for
# HF's q and k, which are views (transposes of the projections): autograd
# refuses a Function that modifies a view in place and returns two tensors,
# and for one it would route the gradient through CopySlices, which copies
# the whole base twice more.


def _bump_versions(keyset, q, k, *args, **kwargs):
    for t in (q, k):
        if t is not None:
            torch.autograd.graph.increment_version(t)
    return ROPE_.redispatch(keyset & torch._C._after_ADInplaceOrView_keyset, q, k, *args, **kwargs)


class _Region(NamedTuple):
    """Where a rotated tensor lies in its base: which base, its geometry
    (size, stride, storage offset relative to the base's), and whether it is
    the whole base (the same elements)."""

    base: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    whole: bool


def _base_of(t: torch.Tensor) -> torch.Tensor:
    return t._base if t._is_view() else t


def _check_view_creation(name: str, t: torch.Tensor) -> None:
    """The views autograd forbids modifying in place (torch's own rule for its in-place ops)."""
    if not t._is_view():
        return
    meta = torch._C._autograd._get_creation_meta(t)
    if meta != torch._C._autograd.CreationMeta.DEFAULT:
        raise RuntimeError(
            f"{_OP}_: {name} is a view autograd does not allow modifying in place ({meta}: the output of a "
            "function returning several views, or a view made under no_grad or inference mode); use liger.rope"
        )


def _regions(q, k) -> tuple[list[torch.Tensor], list[_Region | None]]:
    bases: list[torch.Tensor] = []
    regions: list[_Region | None] = []
    for t in (q, k):
        if t is None:
            regions.append(None)
            continue
        base = _base_of(t)
        index = next((i for i, b in enumerate(bases) if b is base), None)
        if index is None:
            index = len(bases)
            bases.append(base)
        whole = t.numel() == base.numel() and not overlap.self_overlapping(t)
        regions.append(_Region(index, tuple(t.shape), t.stride(), t.storage_offset() - base.storage_offset(), whole))
    if regions[0] is not None and regions[1] is not None and regions[0].base == regions[1].base:
        regions = [r._replace(whole=False) for r in regions]  # one base holding both: neither is all of it
    return bases, regions


def _in_region(t: torch.Tensor, region: _Region) -> torch.Tensor:
    return t.as_strided(region.size, region.stride, t.storage_offset() + region.offset)


class _RopeInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, args, regions, *bases):
        q, k, cos, sin, options = args
        with torch._C._AutoDispatchBelowAutograd():
            call(ROPE_, q, k, cos, sin, options)
        ctx.mark_dirty(*bases)
        _save(ctx, cos, sin, *options)
        ctx.bases = [(b.shape, b.stride()) for b in bases]
        ctx.regions = regions
        return bases if len(bases) > 1 else bases[0]

    @staticmethod
    def backward(ctx, *dbases):
        needs = ctx.needs_input_grad[2:]
        # Incoming gradients in their bases' layouts, so that q's and k's geometry addresses them.
        owned = [False] * len(dbases)
        laid_out = []
        for i, (g, (shape, stride)) in enumerate(zip(dbases, ctx.bases, strict=True)):
            if g is not None and g.stride() != stride:
                g = torch.empty_strided(shape, stride, dtype=g.dtype, device=g.device).copy_(g)
                owned[i] = True
            laid_out.append(g)
        dq, dk = (
            None if r is None or laid_out[r.base] is None or not needs[r.base] else _in_region(laid_out[r.base], r)
            for r in ctx.regions
        )
        grads = list(_transpose_with(ROPE_BACKWARD, ctx, dq, dk, needs=(dq is not None, dk is not None))[:2])
        out: list[torch.Tensor | None] = [None] * len(dbases)
        for region, g in zip(ctx.regions, grads, strict=True):
            if g is None:
                continue
            shape, stride = ctx.bases[region.base]
            if region.whole and g.stride() == region.stride:
                out[region.base] = g.as_strided(shape, stride, g.storage_offset() - region.offset)
                continue
            if out[region.base] is None:  # the parts q and k leave alone pass through
                base_grad = laid_out[region.base]
                out[region.base] = base_grad if owned[region.base] else base_grad.clone()
            _in_region(out[region.base], region).copy_(g)
        return (None, None, *out)


def _rope_inplace_autograd(
    q, k, cos, sin, position_ids=None, cu_seqlens=None, *, pairs="halves", mrope_section=None, mrope_interleaved=False
) -> None:
    options = RopeOptions(position_ids, cu_seqlens, pairs, mrope_section, mrope_interleaved)
    args = (q, k, cos, sin, options)
    tensors = (q, k, cos, sin)
    if forward_ad._current_level >= 0 and any(
        t is not None and forward_ad.unpack_dual(t).tangent is not None for t in tensors
    ):
        raise NotImplementedError(
            f"{_OP}_: forward-mode AD (torch.func.jvp / jacfwd, torch.autograd.forward_ad) does not go through the "
            "in-place rotation (its tangent would be left unrotated); use liger.rope (out of place)"
        )
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        if torch._C._are_functorch_transforms_active():
            raise NotImplementedError(
                f"{_OP}_: gradients through the in-place rotation under torch.func transforms are not supported; "
                "use liger.rope (out of place)"
            )
        _refuse_table_grad(_OP + "_", cos, sin)
        for name, t in (("q", q), ("k", k)):
            if t is not None:
                _check_view_creation(name, t)
        bases, regions = _regions(q, k)
        _RopeInPlace.apply(args, regions, *bases)
        return None
    with torch._C._AutoDispatchBelowAutograd():
        return call(ROPE_, q, k, cos, sin, options)


LIB.impl("rope_", _bump_versions, "ADInplaceOrView", with_keyset=True)
LIB.impl("rope_", _rope_inplace_autograd, "Autograd")
