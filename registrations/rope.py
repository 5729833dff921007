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

import torch

from csrc_free_ops.rope import RopeOptions, launch, reference
from registrations._library import Entries, Prepare, call_from_backward, define_op, register_autograd
from registrations.rope_check import check, check_apart, check_in_place, check_positions

OP = "liger.rope"
# position_ids and cu_seqlens are positional (with defaults): torch.library.register_vmap and
# custom_op take no keyword-only tensors.  The rest are keyword-only.
OPTIONS = "Tensor? position_ids=None, Tensor? cu_seqlens=None, *, str pairs='halves', int[]? mrope_section=None, " \
    "bool mrope_interleaved=False"  # fmt: skip
# --- The schema boundary: each function the registration helper calls takes the schema's
# arguments in order (q, k, cos, sin, then the options in RopeOptions' order) and bundles the
# options into one RopeOptions right there.


def _check_rope(q, k, cos, sin, *schema_options) -> None:
    check(OP, q, k, cos, sin, RopeOptions(*schema_options))


def _check_rope_backward(dq, dk, cos, sin, *schema_options) -> None:
    check(OP + "_backward", dq, dk, cos, sin, RopeOptions(*schema_options), ("dq", "dk"))


def _check_rope_(q, k, cos, sin, *schema_options) -> None:
    check(OP + "_", q, k, cos, sin, RopeOptions(*schema_options))
    check_in_place(OP + "_", q, k)


def _check_rope_apart(q, k, cos, sin, *schema_options) -> None:
    check_apart(OP + "_", q, k)


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
        interpreted=_on_cpu(OP, launch.cuda_forward),
        reference=_on_cpu(OP, reference.forward),
    ),
    prepare=Prepare(
        cuda=_bundled(launch.prepare_cuda_forward), interpreted=_on_cpu_prepared(OP, launch.prepare_cuda_forward)
    ),
)
ROPE_BACKWARD = define_op(
    f"rope_backward(Tensor dq, Tensor? dk, Tensor cos, Tensor sin, {OPTIONS}) -> (Tensor, Tensor?)",
    check=_check_rope_backward,
    fake=_fake,
    entries=Entries(
        cuda=_bundled(launch.cuda_backward),
        npu=_bundled(launch.npu_backward),
        interpreted=_on_cpu(OP + "_backward", launch.cuda_backward),
        reference=_on_cpu(OP + "_backward", reference.backward),
    ),
    prepare=Prepare(
        cuda=_bundled(launch.prepare_cuda_backward),
        interpreted=_on_cpu_prepared(OP + "_backward", launch.prepare_cuda_backward),
    ),
)
ROPE_ = define_op(
    f"rope_(Tensor(a!) q, Tensor(b!)? k, Tensor cos, Tensor sin, {OPTIONS}) -> ()",
    check=_check_rope_,
    check_each_call=_check_rope_apart,
    fake=_fake_,
    traceable=False,  # in place: torch.compile functionalizes the opaque op (auto_functionalized)
    entries=Entries(
        cuda=_bundled(launch.cuda_forward_),
        npu=_bundled(launch.npu_forward_),
        interpreted=_on_cpu(OP + "_", launch.cuda_forward_),
        reference=_on_cpu(OP + "_", reference.forward_),
    ),
    prepare=Prepare(
        cuda=_bundled(launch.prepare_cuda_forward_),
        interpreted=_on_cpu_prepared(OP + "_", launch.prepare_cuda_forward_),
    ),
)


# --- Autograd


def refuse_table_grad(op: str, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if cos.requires_grad or sin.requires_grad:
        raise ValueError(
            f"{op}: cos and sin get no gradient, but one of them requires grad; "
            "pass cos.detach() and sin.detach() (HF's rotary tables need none)"
        )


# Autograd works at the schema: its formulas call the ops, which take the schema's arguments.


def save_options(ctx, cos, sin, position_ids, cu_seqlens, *fixed) -> None:
    """The tensors through save_for_backward, the other options (RopeOptions' order) on ctx."""
    ctx.save_for_backward(cos, sin, position_ids, cu_seqlens)
    ctx.fixed_options = fixed


def _no_table_grad(op: str):
    def setup_context(ctx, inputs, output) -> None:
        _, _, cos, sin, *schema_options = inputs
        refuse_table_grad(op, cos, sin)
        save_options(ctx, cos, sin, *schema_options)

    return setup_context


def transpose_with(op, ctx, dq, dk, needs=None):
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
    return transpose_with(ROPE_BACKWARD, ctx, dq, dk)


def _rope_backward_grad(ctx, ddq, ddk):
    return transpose_with(ROPE, ctx, ddq, ddk)


register_autograd(ROPE, _rope_grad, setup_context=_no_table_grad(OP))
register_autograd(ROPE_BACKWARD, _rope_backward_grad, setup_context=_no_table_grad(OP + "_backward"))
