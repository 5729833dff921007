"""Per op and provider: build inputs for one shape and return the callables
the harness times.

Providers
    liger         this project, through torch.ops.liger.*
    torch         eager reference: Motif's PolyNorm, HF's apply_rotary_pos_emb,
                  torch.nn.functional.group_norm (written out below),
                  transformers' LlamaRMSNorm (written out), F.layer_norm
    compile       torch.compile(reference, dynamic=False), warmed up before timing
    liger_kernel  upstream Liger-Kernel's autograd.Functions, when importable

rope's options (the rope_* variant ops) are built in bench/rope_variants.py.

Every provider of one op gets the same input values (same seed), in the
same dtype, on the same device, in the same memory layout (rope: HF's
(B, T, H, D) storage viewed as (B, H, T, D)).

Upstream specifics that shape the inputs (see bench/lab/NOTES.md):
* LigerPolyNormFunction returns a 0-dim dbias, so its bias is 0-dim (ours
  and the references take the (1,) bias of Motif's module); it is called
  with in_place=True (its module's default), which overwrites the incoming
  output gradient with dx.
* LigerRopeFunction rotates q and k in place when they are HF-layout views
  (and dq, dk in place in backward); the harness tolerates that because only
  timings, not values, are taken after the first correctness check.
* LigerGroupNormFunction takes (x, weight, bias, num_channels, num_groups, eps)
  and needs both weight and bias.
* LigerSiLUMulFunction / LigerGELUMulFunction (swiglu, geglu) write dgate and
  dup into the saved gate and up in place: after the first backward the
  inputs hold gradients (timings only, as for rope).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from bench import rope_variants, shapes

PROVIDERS = ("liger", "torch", "compile", "liger_kernel")

POLY_NORM_EPS = 1e-6
ROW_NORM_EPS = 1e-6
GROUP_NORM_EPS = 1e-5
ROPE_BASE = 10000.0


class ProviderUnavailable(RuntimeError):
    """The provider cannot run here (not installed, unsupported shape, ...)."""


def _as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


@dataclass
class Built:
    """One provider at one shape: ``fn(*args)`` is the forward; gradients are
    taken with respect to ``grad_inputs`` against fixed ``grad_outputs``."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    grad_inputs: tuple[torch.Tensor, ...]
    grad_outputs: tuple[torch.Tensor, ...] = field(default=())

    def forward(self) -> tuple[torch.Tensor, ...]:
        return _as_tuple(self.fn(*self.args))

    def full(self) -> tuple[torch.Tensor, ...]:
        """Forward then backward (the graph is freed afterwards)."""
        outs = self.forward()
        return torch.autograd.grad(outs, self.grad_inputs, self.grad_outputs)

    def forward_timer(self) -> Callable[[], Any]:
        return self.forward

    def _grad_outputs_here(self) -> tuple[torch.Tensor, ...]:
        # Copies made on the current (timing) stream, so the backward never
        # waits on the stream the originals were made on.
        return tuple(g.clone() for g in self.grad_outputs)

    def full_timer(self) -> Callable[[], Any]:
        grad_inputs, grad_outputs = self.grad_inputs, self._grad_outputs_here()

        def full() -> tuple[torch.Tensor, ...]:
            return torch.autograd.grad(self.forward(), grad_inputs, grad_outputs)

        return full

    def backward_timer(self) -> Callable[[], Any]:
        """Run the forward once now (on the current stream, which the
        backward then runs on too); the returned callable runs only the
        backward of that graph (retain_graph=True so it can repeat)."""
        outs = self.forward()
        grad_inputs, grad_outputs = self.grad_inputs, self._grad_outputs_here()

        def backward() -> tuple[torch.Tensor, ...]:
            return torch.autograd.grad(outs, grad_inputs, grad_outputs, retain_graph=True)

        return backward

    def prepare(self, seed: int = 1) -> None:
        """Make the output gradients (in each output's layout) and warm up
        forward and backward (compiles, autotunes) outside any timing."""
        outs = self.forward()
        # A generator of its own: a failed CUDA-graph capture can leave the
        # default one unusable for the rest of the process.
        g = _generator(str(outs[0].device), seed)
        self.grad_outputs = tuple(torch.empty_like(o).normal_(generator=g).detach() for o in outs)
        del outs
        self.full()


# --------------------------------------------------------------------------
# References (eager, plain torch ops)


def motif_poly_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = POLY_NORM_EPS):
    """Motif-2.6B's PolyNorm.forward in plain torch ops, in x's dtype."""

    def norm(u: torch.Tensor) -> torch.Tensor:
        return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps)

    return weight[0] * norm(x**3) + weight[1] * norm(x**2) + weight[2] * norm(x) + bias


def hf_rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def hf_apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """HF transformers' apply_rotary_pos_emb with unsqueeze_dim=1."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return q * cos + hf_rotate_half(q) * sin, k * cos + hf_rotate_half(k) * sin


def torch_group_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, num_groups: int):
    return F.group_norm(x, num_groups, weight, bias, GROUP_NORM_EPS)


def torch_group_norm_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, num_groups: int):
    """A diffusers ResNet block's norm -> SiLU pair."""
    return F.silu(F.group_norm(x, num_groups, weight, bias, GROUP_NORM_EPS))


# --------------------------------------------------------------------------
# Inputs


def _dtype(shape: dict[str, Any]) -> torch.dtype:
    return getattr(torch, shape["dtype"])


def _generator(device: str, seed: int = 0) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def poly_norm_inputs(shape: dict[str, Any], device: str, scalar_bias: bool = False):
    dt, g = _dtype(shape), _generator(device)
    x = torch.randn(shape["M"], shape["H"], device=device, dtype=torch.float32, generator=g).to(dt)
    weight = torch.tensor([0.5, 0.3, 0.2], device=device, dtype=dt)
    bias = torch.tensor(0.1 if scalar_bias else [0.1], device=device, dtype=dt)
    for t in (x, weight, bias):
        t.requires_grad_(True)
    return x, weight, bias


def rope_tables(t: int, d: int, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's (1, T, D) cos and sin tables (positions 0..T-1, duplicated halves)."""
    inv_freq = 1.0 / (ROPE_BASE ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    freqs = torch.outer(torch.arange(t, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)[None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rope_inputs(shape: dict[str, Any], device: str):
    """q (B, Hq, T, D) and k (B, Hkv, T, D) as views of HF's (B, T, H, D)
    storage, requiring grad; cos, sin (1, T, D)."""
    dt, g = _dtype(shape), _generator(device)
    b, t, d = shape["B"], shape["T"], shape["head_dim"]
    q_store = torch.randn(b, t, shape["n_q_heads"], d, device=device, generator=g).to(dt).requires_grad_(True)
    k_store = torch.randn(b, t, shape["n_kv_heads"], d, device=device, generator=g).to(dt).requires_grad_(True)
    cos, sin = rope_tables(t, d, device, dt)
    return q_store.transpose(1, 2), k_store.transpose(1, 2), cos, sin


def _restarting_positions(doc_lens: list[int], device: str) -> torch.Tensor:
    return torch.cat([torch.arange(n, device=device) for n in doc_lens])


def rope_model_inputs(shape: dict[str, Any], device: str):
    """The model_layout set's inputs: (q_src, k_src) the projections' (B, S,
    H*D) outputs, non-leaves made once from leaves that require grad (the
    gradients' targets); cos, sin (1, S, D), gathered at positions restarting
    at each document where the shape has ``doc_lens``.  ``model_views`` makes
    each call's q and k from them."""
    dt, g = _dtype(shape), _generator(device)
    b, t, d = shape["B"], shape["T"], shape["head_dim"]
    leaves = tuple(
        torch.randn(b, t, shape[heads] * d, device=device, generator=g).to(dt).requires_grad_(True)
        for heads in ("n_q_heads", "n_kv_heads")
    )
    srcs = tuple(leaf.clone() for leaf in leaves)  # a projection-like producer (CloneBackward0) that saves nothing
    if "doc_lens" in shape:
        cos, sin = rope_tables(max(shape["doc_lens"]), d, device, dt)
        positions = _restarting_positions(shape["doc_lens"], device)
        cos, sin = cos[:, positions], sin[:, positions]
    else:
        cos, sin = rope_tables(t, d, device, dt)
    return leaves, srcs, cos, sin


def model_views(q_src: torch.Tensor, k_src: torch.Tensor, shape: dict[str, Any]):
    """q, k as a transformers attention layer hands them to apply_rotary_pos_emb:
    F.linear's output (``_unsafe_view`` of the matmul's, sharing its memory
    without being a view) viewed (B, S, H, D) and transposed (B, H, S, D)."""
    b, t, d = shape["B"], shape["T"], shape["head_dim"]
    out = []
    for src, heads in ((q_src, shape["n_q_heads"]), (k_src, shape["n_kv_heads"])):
        projected = torch.ops.aten._unsafe_view(src, src.shape)
        out.append(projected.view(b, t, heads, d).transpose(1, 2))
    return out


def group_norm_inputs(shape: dict[str, Any], device: str):
    """x (M, C, H), or (M, C, h, w) where the shape has ``spatial`` = [h, w]
    (H = h*w then; the diffusion sets), in torch.channels_last where the
    shape's ``layout`` says so; weight and bias (C,); all requiring grad."""
    dt, g = _dtype(shape), _generator(device)
    c = shape["C"]
    spatial = tuple(shape["spatial"]) if "spatial" in shape else (shape["H"],)
    x = torch.randn(shape["M"], c, *spatial, device=device, generator=g).to(dt)
    if shape.get("layout") == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    weight = (1.0 + 0.1 * torch.randn(c, device=device, generator=g)).to(dt)
    bias = (0.1 * torch.randn(c, device=device, generator=g)).to(dt)
    for t in (x, weight, bias):
        t.requires_grad_(True)
    return x, weight, bias


# --------------------------------------------------------------------------
# Providers


@functools.cache
def _liger_ops() -> None:
    import registrations  # noqa: F401  (defines torch.ops.liger.*)


@functools.cache
def _upstream() -> Any:
    try:
        import liger_kernel.ops as ops
    except Exception as e:  # ImportError, or a triton/torch mismatch inside it
        raise ProviderUnavailable(f"liger_kernel not importable: {type(e).__name__}: {e}") from None
    return ops


def upstream_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("liger_kernel")
    except Exception:
        return None


def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    # dynamic=False specialises on every shape; reset so the recompile limit
    # never silently drops a shape back to eager.
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def retained_backward_context(provider: str) -> Any:
    """For compile: donated buffers off, both while compiling and while the
    backward runs.  AOTAutograd's donated buffers (on by default) forbid
    retain_graph=True, which the backward-only timing needs, and the check
    reads the config at every backward.  The harness builds a second
    compile-provider instance under this for the backward mode; forward and
    full keep the default (donating) compile."""
    if provider != "compile":
        return contextlib.nullcontext()
    import torch._functorch.config as cfg  # not imported by `import torch` on torch 2.11

    return cfg.patch(donated_buffer=False) if hasattr(cfg, "donated_buffer") else contextlib.nullcontext()


def _build_poly_norm(provider: str, shape: dict[str, Any], device: str) -> Built:
    if provider == "liger_kernel":
        fn_cls = _upstream().LigerPolyNormFunction
        x, w, b = poly_norm_inputs(shape, device, scalar_bias=True)
        return Built(lambda x, w, b: fn_cls.apply(x, w, b, POLY_NORM_EPS, True), (x, w, b), (x, w, b))
    x, w, b = poly_norm_inputs(shape, device)
    if provider == "liger":
        _liger_ops()
        fn = lambda x, w, b: torch.ops.liger.poly_norm(x, w, b, POLY_NORM_EPS)
    elif provider == "torch":
        fn = motif_poly_norm
    elif provider == "compile":
        fn = _compiled(motif_poly_norm)
    else:
        raise ValueError(provider)
    return Built(fn, (x, w, b), (x, w, b))


def row_norm_inputs(shape: dict[str, Any], device: str, bias: bool):
    dt, g = _dtype(shape), _generator(device)
    h = shape["H"]
    x = torch.randn(shape["M"], h, device=device, dtype=torch.float32, generator=g).to(dt)
    params = [torch.randn(h, device=device, dtype=torch.float32, generator=g).to(dt) for _ in range(2 if bias else 1)]
    for t in (x, *params):
        t.requires_grad_(True)
    return x, *params


def llama_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = ROW_NORM_EPS) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward, written out."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def torch_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], weight, bias, ROW_NORM_EPS)


def _build_rms_norm(provider: str, shape: dict[str, Any], device: str) -> Built:
    x, w = row_norm_inputs(shape, device, bias=False)
    if provider == "liger":
        _liger_ops()
        fn = lambda x, w: torch.ops.liger.rms_norm(x, w, ROW_NORM_EPS)
    elif provider == "torch":
        fn = llama_rms_norm
    elif provider == "compile":
        fn = _compiled(llama_rms_norm)
    elif provider == "liger_kernel":  # upstream's defaults: offset 0, Llama casting; in_place=False keeps dy intact
        fn_cls = _upstream().LigerRMSNormFunction
        fn = lambda x, w: fn_cls.apply(x, w, ROW_NORM_EPS, 0.0, "llama", False)
    else:
        raise ValueError(provider)
    return Built(fn, (x, w), (x, w))


def _build_layer_norm(provider: str, shape: dict[str, Any], device: str) -> Built:
    x, w, b = row_norm_inputs(shape, device, bias=True)
    if provider == "liger":
        _liger_ops()
        fn = lambda x, w, b: torch.ops.liger.layer_norm(x, w, b, ROW_NORM_EPS)
    elif provider == "torch":
        fn = torch_layer_norm
    elif provider == "compile":
        fn = _compiled(torch_layer_norm)
    elif provider == "liger_kernel":
        fn_cls = _upstream().LigerLayerNormFunction
        fn = lambda x, w, b: fn_cls.apply(x, w, b, ROW_NORM_EPS)
    else:
        raise ValueError(provider)
    return Built(fn, (x, w, b), (x, w, b))


def _rope_fn(provider: str, model_layout: bool) -> Callable[..., Any]:
    if provider == "liger":
        _liger_ops()
        if model_layout:  # the patch's path: in place where autograd allows
            from liger_nn import apply_rotary_pos_emb

            return apply_rotary_pos_emb
        return torch.ops.liger.rope
    if provider == "torch":
        return hf_apply_rotary_pos_emb
    if provider == "compile":
        return _compiled(hf_apply_rotary_pos_emb)
    if provider == "liger_kernel":
        fn_cls = _upstream().LigerRopeFunction
        return lambda q, k, cos, sin: fn_cls.apply(q, k, cos, sin)
    raise ValueError(provider)


def _build_rope_model_layout(provider: str, shape: dict[str, Any], device: str) -> Built:
    leaves, srcs, cos, sin = rope_model_inputs(shape, device)
    rotary = _rope_fn(provider, model_layout=True)

    def fn(q_src, k_src, cos, sin):
        return rotary(*model_views(q_src, k_src, shape), cos, sin)

    return Built(fn, (*srcs, cos, sin), leaves)


def _build_rope(provider: str, shape: dict[str, Any], device: str) -> Built:
    if shape.get("layout") == "model":
        return _build_rope_model_layout(provider, shape, device)
    q, k, cos, sin = rope_inputs(shape, device)
    return Built(_rope_fn(provider, model_layout=False), (q, k, cos, sin), (q, k))


def _build_group_norm(provider: str, shape: dict[str, Any], device: str) -> Built:
    x, w, b = group_norm_inputs(shape, device)
    groups = shapes.num_groups(shape)
    if provider == "liger":
        _liger_ops()
        fn = lambda x, w, b: torch.ops.liger.group_norm(x, groups, w, b, GROUP_NORM_EPS)
    elif provider == "torch":
        fn = lambda x, w, b: torch_group_norm(x, w, b, groups)
    elif provider == "compile":
        compiled = _compiled(torch_group_norm)
        fn = lambda x, w, b: compiled(x, w, b, groups)
    elif provider == "liger_kernel":
        fn_cls = _upstream().LigerGroupNormFunction
        c = shape["C"]
        fn = lambda x, w, b: fn_cls.apply(x, w, b, c, groups, GROUP_NORM_EPS)
    else:
        raise ValueError(provider)
    return Built(fn, (x, w, b), (x, w, b))


def _build_group_norm_silu(provider: str, shape: dict[str, Any], device: str) -> Built:
    """Ours fused (activation="silu"); torch and compile run silu(F.group_norm(x))
    (compile: Inductor's own fusion of the pair); upstream, LigerGroupNormFunction then F.silu."""
    x, w, b = group_norm_inputs(shape, device)
    groups = shapes.num_groups(shape)
    if provider == "liger":
        _liger_ops()
        fn = lambda x, w, b: torch.ops.liger.group_norm(x, groups, w, b, GROUP_NORM_EPS, activation="silu")
    elif provider == "torch":
        fn = lambda x, w, b: torch_group_norm_silu(x, w, b, groups)
    elif provider == "compile":
        compiled = _compiled(torch_group_norm_silu)
        fn = lambda x, w, b: compiled(x, w, b, groups)
    elif provider == "liger_kernel":
        fn_cls = _upstream().LigerGroupNormFunction
        c = shape["C"]
        fn = lambda x, w, b: F.silu(fn_cls.apply(x, w, b, c, groups, GROUP_NORM_EPS))
    else:
        raise ValueError(provider)
    return Built(fn, (x, w, b), (x, w, b))


def torch_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """transformers' LlamaMLP between its projections: act_fn(gate) * up."""
    return F.silu(gate) * up


def torch_geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """GemmaMLP's, with gelu_pytorch_tanh."""
    return F.gelu(gate, approximate="tanh") * up


def torch_geglu_exact(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """diffusers' GEGLU after its projection: up * gelu(gate), the exact GELU."""
    return up * F.gelu(gate)


GLU_REFERENCES = {"swiglu": torch_swiglu, "geglu": torch_geglu, "geglu_exact": torch_geglu_exact}


def glu_inputs(shape: dict[str, Any], device: str):
    """gate and up (T, F), two projections' outputs, requiring grad."""
    dt, g = _dtype(shape), _generator(device)
    return tuple(
        torch.randn(shape["T"], shape["F"], device=device, generator=g).to(dt).requires_grad_(True) for _ in "gu"
    )


def _build_glu(op: str, provider: str, shape: dict[str, Any], device: str) -> Built:
    if provider == "liger_kernel" and "no_upstream" in shape:
        raise ProviderUnavailable(shape["no_upstream"])
    gate, up = glu_inputs(shape, device)
    reference = GLU_REFERENCES[op]
    if provider == "liger":
        _liger_ops()
        fn = getattr(torch.ops.liger, op)
    elif provider == "torch":
        fn = reference
    elif provider == "compile":
        fn = _compiled(reference)
    elif provider == "liger_kernel":
        fn_cls = getattr(_upstream(), "LigerSiLUMulFunction" if op == "swiglu" else "LigerGELUMulFunction")
        fn = fn_cls.apply
    else:
        raise ValueError(provider)
    return Built(fn, (gate, up), (gate, up))


def lm_targets(device: str, n_classes: int, rows: int) -> torch.Tensor:
    """Targets as a language model's labels are: every row counted."""
    return torch.randint(0, n_classes, (rows,), device=device, generator=_generator(device, 1))


def torch_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, target)


def torch_linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(F.linear(x, weight), target)


def _build_cross_entropy(provider: str, shape: dict[str, Any], device: str) -> Built:
    rows, n_classes = shape["BT"], shape["V"]
    logits = torch.randn(rows, n_classes, device=device, dtype=_dtype(shape), generator=_generator(device))
    logits.requires_grad_()
    target = lm_targets(device, n_classes, rows)
    if provider == "liger":
        _liger_ops()
        fn = lambda x, t: torch.ops.liger.cross_entropy(x, t)[0]
    elif provider == "torch":
        fn = torch_cross_entropy
    elif provider == "compile":
        fn = _compiled(torch_cross_entropy)
    elif provider == "liger_kernel":
        fn_cls = _upstream().LigerCrossEntropyFunction
        # Upstream writes the gradient over its input in the forward; each call gets a fresh copy to overwrite.
        fn = lambda x, t: fn_cls.apply(x * 1, t, None, -100, 0.0, 0.0, "mean", None, False)[0]
    else:
        raise ValueError(provider)
    return Built(fn, (logits, target), (logits,))


def _build_fused_linear_cross_entropy(provider: str, shape: dict[str, Any], device: str) -> Built:
    rows, hidden, n_classes = shape["BT"], shape["H"], shape["V"]
    g = _generator(device)
    x = torch.randn(rows, hidden, device=device, dtype=_dtype(shape), generator=g).requires_grad_()
    weight = torch.randn(n_classes, hidden, device=device, dtype=_dtype(shape), generator=g) / hidden**0.5
    weight.requires_grad_()
    target = lm_targets(device, n_classes, rows)
    if provider == "liger":
        _liger_ops()
        fn = lambda x, w, t: torch.ops.liger.fused_linear_cross_entropy(x, w, t)[0]
    elif provider == "torch":
        fn = torch_linear_cross_entropy
    elif provider == "compile":
        fn = _compiled(torch_linear_cross_entropy)
    elif provider == "liger_kernel":
        fn_cls = _upstream().LigerFusedLinearCrossEntropyFunction
        fn = lambda x, w, t: fn_cls.apply(x, w, t, None, None, -100, 0.0, 0.0, "mean", None, False)[0]
    else:
        raise ValueError(provider)
    return Built(fn, (x, weight, target), (x, weight))


def _build_rope_variant(op: str, provider: str, shape: dict[str, Any], device: str) -> Built:
    fn, args, grad_inputs = rope_variants.build(op, provider, shape, device, _compiled, _upstream, ProviderUnavailable)
    return Built(fn, args, grad_inputs)


_BUILDERS = {
    "cross_entropy": _build_cross_entropy,
    "fused_linear_cross_entropy": _build_fused_linear_cross_entropy,
    "poly_norm": _build_poly_norm,
    "rope": _build_rope,
    "group_norm": _build_group_norm,
    "group_norm_silu": _build_group_norm_silu,
    "rms_norm": _build_rms_norm,
    "layer_norm": _build_layer_norm,
}
_BUILDERS.update({op: functools.partial(_build_rope_variant, op) for op in shapes.ROPE_VARIANTS})
_BUILDERS.update({op: functools.partial(_build_glu, op) for op in shapes.GLU_OPS})


def build(op: str, provider: str, shape: dict[str, Any], device: str) -> Built:
    """Inputs and callables of ``provider`` for ``op`` at ``shape`` (not yet warmed up)."""
    if provider not in PROVIDERS:
        raise ValueError(f"unknown provider {provider!r}; choose from {', '.join(PROVIDERS)}")
    return _BUILDERS[op](provider, shape, device)


def rel_error(outs: Sequence[torch.Tensor], refs: Sequence[torch.Tensor]) -> float:
    """Largest max|out - ref| / max|ref| over the outputs (float32 math)."""
    worst = 0.0
    for o, r in zip(outs, refs, strict=True):
        o32, r32 = o.detach().float(), r.detach().float()
        if o32.shape != r32.shape:
            return float("inf")
        scale = r32.abs().max().item() or 1.0
        err = (o32 - r32).abs().max().item() / scale
        if not math.isfinite(err):
            return float("inf")
        worst = max(worst, err)
    return worst


# Warn when a provider's forward is further than this from the torch provider's.
CHECK_TOLERANCE = {"float32": 1e-3, "float16": 2e-2, "bfloat16": 5e-2}
