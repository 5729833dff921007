"""Shape sets per op.

A set is a list of sweeps; a sweep varies one dimension (``x_name``) over
``x_values`` with everything else fixed (``config``).  ``config`` goes into
each record's ``extra_benchmark_config_str`` as JSON.

Sets:

* ``seeds``: the upstream Liger-Kernel benchmark shapes.
    poly_norm   M=2048 rows, H in 256..4096, bf16
    rope        batch 1, 32 q / 8 kv heads, head_dim 256, seq 1024..16384, bf16
    group_norm  (M=128, C, H=512), 4 channels per group, C in 32..2048, fp32
    rms_norm    M=2048 rows, H in 1024..32768, bf16 (Llama casting)
    layer_norm  M=4096 rows, H in 1024..16384, bf16 (weight and bias)
* ``large``: shapes that keep an H200 busy.
    poly_norm   M=16384, H in {2048, 4096, 8192}, bf16
    rope        batch 4, otherwise as seeds
    group_norm  (8, 512, 4096), 32 groups, bf16 and fp32
    rms_norm    M=16384, H in {2048, 4096, 8192}, bf16; and Qwen3's per-head q/k
                norm: M=8*512*32 rows of head_dim 128
    layer_norm  M=16384, H in {2048, 4096, 8192}, bf16
* ``diffusion`` (group_norm only): Stable-Diffusion-style UNet / VAE
  activations, GroupNorm(32), bf16 and fp32:
    (2, 320, 64x64), (8, 640, 32x32), (16, 1280, 16x16), (4, 512, 128x128),
    (1, 128, 512x512)
  Each dtype is one sweep over C (every shape has its own C); the batch and
  image size of each C are in the config's ``points`` (C -> [N, h, w]), and
  the inputs are 4-D (N, C, h, w) as a UNet passes them.
* ``diffusion_cl`` (group_norm and group_norm_silu): the diffusion shapes
  with x in ``torch.channels_last`` (as diffusers' optimization guide runs
  UNets and VAEs); the config's ``layout`` says so.
* ``variants`` (the rope_* variant ops only): rope's options at model shapes, bf16
  (bench/rope_variants.py has the providers):
    rope_position_ids  Llama: B=2, 32/8 heads, D=128, (B, S) ids into a (32768, 128) table, S 4096, 16384
    rope_interleaved   S=8192: Cohere (32/8 heads, R=D=128), GLM-4 (32/2 heads, D=128, R=64)
    rope_partial       Phi-4-mini (Phi3): S=8192, 24/8 heads, D=128, R=96
    rope_k_only        KV-cache append: B=8, 8 kv heads, D=128, 1 or 2048 new tokens at position 4096+
    rope_mrope         S=8192 (a 64x64 image, then text): Qwen2-VL (28/4 heads, mrope_section
                       [16, 24, 24]) and Qwen3-VL (32/8 heads, [24, 20, 20], interleaved), D=128
    rope_packed        8 documents of mixed lengths in 16384 tokens, (T, H, D), 32/8 heads, D=128,
                       by cu_seqlens and by position ids restarting at each document
* ``model_layout`` (rope only): q and k as a transformers model hands them
  to apply_rotary_pos_emb, each call: ``_unsafe_view`` of the projection's
  (B, S, H*D) output (what F.linear without bias returns), viewed
  (B, S, H, D) and transposed to (B, H, S, D); bf16, (1, S, D) tables.
  ``liger`` is the patch's path (liger_nn.apply_rotary_pos_emb: in place
  where autograd allows, which it does here).  One sweep per shape:
    (B, S, Hq/Hkv, D) = (1, 8192, 32/8, 128), (2, 4096, 64/8, 128),
    (4, 4096, 32/8, 128), (8, 2048, 16/16, 64), Qwen2-7B (2, 4096, 28/4, 128),
    and 8 packed documents in 16384 tokens (B = 1, 32/8 heads, D = 128,
    tables gathered at positions restarting at each document, as
    transformers does for packed sequences).
* swiglu, geglu (the elementwise op alone: gate and up (T, F) from two
  projections, bf16): ``seeds`` upstream's token sweep (benchmark_swiglu.py /
  benchmark_geglu.py, whose default model is Llama-3-8B: F = 14336), T in
  1024..16384; ``large`` T = 16384 at Llama-3-8B's F = 14336 and Gemma-7B's
  F = 24576.  (Upstream times the whole MLP; these rows time the op.)
* the losses, ``seeds``:
    cross_entropy               upstream's sweep over the vocabulary: BT=4096 rows (Llama 3 8B's
                                B*T), V in 4096..131072, bf16, mean over every row
    fused_linear_cross_entropy  upstream's sweep over the tokens at Llama 3 8B's head: H=4096,
                                V=128256, BT in 4096..32768, bf16 (loss only: the logits never leave)
* ``large`` for the losses: cross_entropy BT=16384 at V 32000, 128256, 151936 (Llama 2, Llama 3,
  Qwen2), bf16; fused_linear_cross_entropy the step benchmark's Llama heads (H=2048, V 32000 and
  128256) at BT 8192 and 4096.
* ``tiny``: interpreter-sized shapes for ``--device cpu`` smoke runs.
* ``tiny_model_layout``: the model_layout set's inputs at interpreter size.
* ``tiny_diffusion``: the diffusion set's layout (4-D, per-C points) at
  interpreter size, so the CPU tests walk the same code.

``group_norm_silu`` is silu(group_norm(x)), the norm -> SiLU pair of every
diffusers ResNet block: ours is one call with ``activation="silu"``; the
rivals run the pair as written (bench/providers.py).  It has the image sets
(diffusion, diffusion_cl, tiny_diffusion) and tiny.

Ops without a sweep in a set (poly_norm and rope in ``diffusion``, the rope
variants everywhere but ``variants`` and ``tiny``, everything but rope in
``model_layout``) are skipped in that set.
``quick=True`` keeps the first, middle and last x of each sweep (and for
``large`` rope only the two shortest sequences).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# rope's keyword options, one op key each (bench/rope_variants.py).
ROPE_VARIANTS = ("rope_position_ids", "rope_interleaved", "rope_partial", "rope_k_only", "rope_mrope", "rope_packed")
GLU_OPS = ("swiglu", "geglu", "geglu_exact")
# Upstream Liger-Kernel has no gated unit with the exact (erf) GELU.
NO_EXACT_GELU = "upstream has no exact-GELU gated unit"
LOSSES = ("cross_entropy", "fused_linear_cross_entropy")
OPS = (
    "poly_norm",
    "rope",
    "group_norm",
    "group_norm_silu",
    "rms_norm",
    "layer_norm",
    *GLU_OPS,
    *ROPE_VARIANTS,
    *LOSSES,
)
# What a run measures when --ops is not given; --ops takes a group's name for its ops.
DEFAULT_OPS = ("poly_norm", "rope", "group_norm", *LOSSES)
OP_GROUPS = {"rope_variants": ROPE_VARIANTS}
SETS = (
    "seeds",
    "large",
    "diffusion",
    "diffusion_cl",
    "variants",
    "model_layout",
    "tiny",
    "tiny_diffusion",
    "tiny_model_layout",
)
# What a run measures when --sets is not given.
DEFAULT_SETS = ("seeds", "large", "diffusion", "variants")
# rope_packed's documents: 8 of mixed lengths in 16384 tokens.
PACKED_DOC_LENS = (4096, 512, 3072, 1024, 2560, 256, 3584, 1280)
# rope's model_layout set: variant -> (B, Hq, Hkv, D, S).
MODEL_LAYOUT_SHAPES = {
    "b1_h32_kv8_d128": (1, 32, 8, 128, 8192),
    "b2_h64_kv8_d128": (2, 64, 8, 128, 4096),
    "b4_h32_kv8_d128": (4, 32, 8, 128, 4096),
    "b8_h16_kv16_d64": (8, 16, 16, 64, 2048),
    "qwen2_b2_h28_kv4_d128": (2, 28, 4, 128, 4096),
}
# group_norm's diffusion shapes: C -> (N, h, w), GroupNorm(32).
DIFFUSION_POINTS = {320: (2, 64, 64), 640: (8, 32, 32), 1280: (16, 16, 16), 512: (4, 128, 128), 128: (1, 512, 512)}
TINY_DIFFUSION_POINTS = {8: (2, 4, 4), 16: (1, 2, 3)}


@dataclass(frozen=True)
class Sweep:
    op: str
    set_name: str
    x_name: str
    x_label: str
    x_values: tuple[int, ...]
    config: dict[str, Any] = field(default_factory=dict)

    def shape(self, x: int) -> dict[str, Any]:
        """The full shape config at one x (config plus x_name=x)."""
        return point(self.config, self.x_name, x)

    @property
    def tag(self) -> str:
        """Short label distinguishing sweeps of one set (the dtype, and the variant where there is one)."""
        return " ".join(str(self.config[k]) for k in ("variant", "dtype") if k in self.config)


def point(config: dict[str, Any], x_name: str, x: int) -> dict[str, Any]:
    """The full shape at one x: config plus x_name=x, and where the config
    has ``points`` (x -> [N, h, w], keys as JSON writes them), that x's batch
    ``M``, image ``spatial`` = [h, w] and flattened size ``H`` = h*w."""
    shape = {k: v for k, v in config.items() if k != "points"}
    shape[x_name] = x
    if "points" in config:
        n, h, w = config["points"][str(x)]
        shape.update(M=n, H=h * w, spatial=[h, w])
    return shape


def describe(shape: dict[str, Any], x_name: str) -> str:
    """How a summary row names its shape: ``(N, C, hxw)`` for image shapes,
    else ``x_name=x``; then the variant, where the sweep has one."""
    if "spatial" in shape:
        h, w = shape["spatial"]
        layout = " channels_last" if shape.get("layout") == "channels_last" else ""
        return f"({shape['M']}, {shape['C']}, {h}x{w}){layout}"
    variant = f" {shape['variant']}" if "variant" in shape else ""
    return f"{x_name}={shape[x_name]}{variant}"


def _pow2(lo: int, hi: int) -> tuple[int, ...]:
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= 2
    return tuple(out)


def _poly_norm(set_name: str) -> list[Sweep]:
    if set_name in ("diffusion", "diffusion_cl", "tiny_diffusion", "variants", "model_layout", "tiny_model_layout"):
        return []
    if set_name == "seeds":
        return [Sweep("poly_norm", set_name, "H", "hidden size", _pow2(256, 4096), {"M": 2048, "dtype": "bfloat16"})]
    if set_name == "large":
        return [Sweep("poly_norm", set_name, "H", "hidden size", (2048, 4096, 8192), {"M": 16384, "dtype": "bfloat16"})]
    return [Sweep("poly_norm", set_name, "H", "hidden size", (64,), {"M": 4, "dtype": "float32"})]


def _glu(op: str, set_name: str) -> list[Sweep]:
    """x = T tokens; F the intermediate size."""
    rival = {"no_upstream": NO_EXACT_GELU} if op == "geglu_exact" else {}
    if set_name == "seeds":
        return [
            Sweep(op, set_name, "T", "total tokens", _pow2(1024, 16384), {"F": 14336, "dtype": "bfloat16", **rival})
        ]
    if set_name == "large":
        return [Sweep(op, set_name, "T", "total tokens", (16384,), {"F": f, "dtype": "bfloat16", "variant": v, **rival})
                for f, v in ((14336, "llama3_8b"), (24576, "gemma_7b"))]  # fmt: skip
    if set_name == "tiny":
        return [Sweep(op, set_name, "T", "total tokens", (4,), {"F": 40, "dtype": "float32", **rival})]
    return []


def _row_norm(op: str, set_name: str) -> list[Sweep]:
    """rms_norm / layer_norm: upstream's benchmark_rms_norm.py / benchmark_layer_norm.py shapes, then large."""
    hidden = "hidden size"
    if set_name == "seeds":
        rows, top = (2048, 32768) if op == "rms_norm" else (4096, 16384)
        return [Sweep(op, set_name, "H", hidden, _pow2(1024, top), {"M": rows, "dtype": "bfloat16"})]
    if set_name == "large":
        found = [Sweep(op, set_name, "H", hidden, (2048, 4096, 8192), {"M": 16384, "dtype": "bfloat16"})]
        if op == "rms_norm":  # Qwen3's q/k norms: every head of B=8, S=512, 32 heads normalised over head_dim
            found.append(Sweep(op, set_name, "H", "head_dim", (128,), {"M": 8 * 512 * 32, "dtype": "bfloat16"}))
        return found
    if set_name == "tiny":
        return [Sweep(op, set_name, "H", hidden, (64,), {"M": 4, "dtype": "float32"})]
    return []


def _model_layout(set_name: str) -> list[Sweep]:
    """rope's model_layout sweeps: one per shape, x = S (or the packed token count)."""
    seq = "sequence length"
    if set_name == "tiny_model_layout":
        tiny = {"B": 2, "n_q_heads": 2, "n_kv_heads": 1, "head_dim": 8, "dtype": "float32", "layout": "model"}
        packed = {**tiny, "B": 1, "doc_lens": [3, 1, 4], "variant": "packed"}
        return [Sweep("rope", set_name, "T", seq, (4,), {**tiny, "variant": "tiny"}),
                Sweep("rope", set_name, "T", "packed tokens", (8,), packed)]  # fmt: skip
    out = []
    for variant, (b, hq, hkv, d, s) in MODEL_LAYOUT_SHAPES.items():
        cfg = {"B": b, "n_q_heads": hq, "n_kv_heads": hkv, "head_dim": d, "dtype": "bfloat16", "layout": "model"}
        out.append(Sweep("rope", set_name, "T", seq, (s,), {**cfg, "variant": variant}))
    packed = {"B": 1, "n_q_heads": 32, "n_kv_heads": 8, "head_dim": 128, "dtype": "bfloat16", "layout": "model",
              "doc_lens": list(PACKED_DOC_LENS), "variant": "packed_8docs_h32_kv8_d128"}  # fmt: skip
    out.append(Sweep("rope", set_name, "T", "packed tokens", (sum(PACKED_DOC_LENS),), packed))
    return out


def _rope(set_name: str) -> list[Sweep]:
    if set_name in ("model_layout", "tiny_model_layout"):
        return _model_layout(set_name)
    if set_name in ("diffusion", "diffusion_cl", "tiny_diffusion", "variants"):
        return []
    base = {"n_q_heads": 32, "n_kv_heads": 8, "head_dim": 256, "dtype": "bfloat16"}
    if set_name == "seeds":
        return [Sweep("rope", set_name, "T", "sequence length", _pow2(1024, 16384), {"B": 1, **base})]
    if set_name == "large":
        return [Sweep("rope", set_name, "T", "sequence length", _pow2(1024, 16384), {"B": 4, **base})]
    tiny = {"B": 1, "n_q_heads": 2, "n_kv_heads": 1, "head_dim": 8, "dtype": "float32"}
    return [Sweep("rope", set_name, "T", "sequence length", (4,), tiny)]


def _image_sweeps(
    set_name: str,
    points: dict[int, tuple[int, int, int]],
    num_groups: int,
    dtypes: tuple[str, ...],
    op: str = "group_norm",
    **extra: Any,
) -> list[Sweep]:
    cfg_points = {str(c): list(points[c]) for c in sorted(points)}
    return [
        Sweep(
            op,
            set_name,
            "C",
            "num channels",
            tuple(sorted(points)),
            {"num_groups": num_groups, "dtype": dt, **extra, "points": cfg_points},
        )  # fmt: skip
        for dt in dtypes
    ]


def _group_norm(set_name: str, op: str = "group_norm") -> list[Sweep]:
    if set_name in ("variants", "model_layout", "tiny_model_layout"):
        return []
    if set_name == "diffusion":
        return _image_sweeps(set_name, DIFFUSION_POINTS, 32, ("bfloat16", "float32"), op)
    if set_name == "diffusion_cl":
        return _image_sweeps(set_name, DIFFUSION_POINTS, 32, ("bfloat16", "float32"), op, layout="channels_last")
    if set_name == "tiny_diffusion":
        return _image_sweeps(set_name, TINY_DIFFUSION_POINTS, 4, ("float32",), op)
    if op == "group_norm_silu" and set_name != "tiny":
        return []
    if set_name == "seeds":
        cfg = {"M": 128, "H": 512, "channels_per_group": 4, "dtype": "float32"}
        return [Sweep("group_norm", set_name, "C", "num channels", _pow2(32, 2048), cfg)]
    if set_name == "large":
        return [
            Sweep(
                "group_norm", set_name, "C", "num channels", (512,), {"M": 8, "H": 4096, "num_groups": 32, "dtype": dt}
            )
            for dt in ("bfloat16", "float32")
        ]
    return [Sweep(op, set_name, "C", "num channels", (8,), {"M": 2, "H": 4, "num_groups": 2, "dtype": "float32"})]


def _variant_sweep(op: str, set_name: str, x_label: str, xs: tuple[int, ...], **config: Any) -> Sweep:
    return Sweep(op, set_name, "T", x_label, xs, config)


NO_INTERLEAVED = "liger_kernel 0.8.5's interleaved pairs (LigerLlama4RopeFunction) rotate the whole head"
NO_SINGLE = "liger_kernel 0.8.5's rope takes q and k both"


def _rope_variant(op: str, set_name: str) -> list[Sweep]:
    """The rope_* variant ops: model shapes in ``variants``, interpreter-sized ones in ``tiny``."""
    if set_name not in ("variants", "tiny"):
        return []
    tiny = set_name == "tiny"
    seq = "sequence length"
    if tiny:
        dt, heads, d, s = "float32", {"n_q_heads": 2, "n_kv_heads": 1}, 8, (4,)
    else:
        dt, heads, d, s = "bfloat16", {"n_q_heads": 32, "n_kv_heads": 8}, 128, (8192,)
    base = {"B": 1, **heads, "head_dim": d, "dtype": dt}
    if op == "rope_position_ids":
        xs, cfg = ((4,), {"B": 2, "max_pos": 8}) if tiny else ((4096, 16384), {"B": 2, "max_pos": 32768})
        return [_variant_sweep(op, set_name, seq, xs, **{**base, **cfg}, variant="llama")]
    if op == "rope_interleaved":
        glm = {"n_kv_heads": 1, "rotary_dim": 4} if tiny else {"n_kv_heads": 2, "rotary_dim": 64}
        return [
            _variant_sweep(op, set_name, seq, s, **base, rotary_dim=d, variant="cohere"),
            _variant_sweep(op, set_name, seq, s, **{**base, **glm}, variant="glm", no_upstream=NO_INTERLEAVED),
        ]
    if op == "rope_partial":
        cfg = {"head_dim": 16, "rotary_dim": 12} if tiny else {"n_q_heads": 24, "rotary_dim": 96}
        return [_variant_sweep(op, set_name, seq, s, **{**base, **cfg}, variant="phi3")]
    if op == "rope_k_only":
        cfg = {"B": 2, "n_kv_heads": 1, "cache_len": 5, "max_pos": 16}
        xs = (3,)
        if not tiny:
            cfg, xs = {"B": 8, "n_kv_heads": 8, "cache_len": 4096, "max_pos": 8192}, (1, 2048)
        k_only = {k: v for k, v in base.items() if k != "n_q_heads"} | cfg
        return [_variant_sweep(op, set_name, "new tokens per sequence", xs, **k_only, no_upstream=NO_SINGLE)]
    if op == "rope_mrope":
        if tiny:
            qwen2 = qwen3 = {"mrope_section": [2, 1, 1], "grid": [2, 2], "max_pos": 8}
            s = (6,)
        else:
            qwen2 = {"n_q_heads": 28, "n_kv_heads": 4, "mrope_section": [16, 24, 24], "grid": [64, 64]}
            qwen3 = {"mrope_section": [24, 20, 20], "grid": [64, 64]}
            qwen2["max_pos"] = qwen3["max_pos"] = 8192
        return [
            _variant_sweep(op, set_name, seq, s, **{**base, **qwen2}, mrope_interleaved=False, variant="qwen2_vl"),
            _variant_sweep(op, set_name, seq, s, **{**base, **qwen3}, mrope_interleaved=True, variant="qwen3_vl"),
        ]
    if op == "rope_packed":
        docs, max_pos = ([3, 1, 4], 8) if tiny else (list(PACKED_DOC_LENS), 8192)
        cfg = {**base, "doc_lens": docs, "max_pos": max_pos}
        return [
            _variant_sweep(op, set_name, "packed tokens", (sum(docs),), **cfg, variant=v)
            for v in ("cu_seqlens", "position_ids")
        ]
    raise ValueError(op)


_NO_LOSS_SETS = ("diffusion", "diffusion_cl", "tiny_diffusion", "variants", "model_layout", "tiny_model_layout")


def _cross_entropy(set_name: str) -> list[Sweep]:
    if set_name in _NO_LOSS_SETS:
        return []
    if set_name == "seeds":
        return [
            Sweep("cross_entropy", set_name, "V", "vocabulary", _pow2(4096, 131072), {"BT": 4096, "dtype": "bfloat16"})
        ]
    if set_name == "large":
        return [Sweep("cross_entropy", set_name, "V", "vocabulary", (32000, 128256, 151936),
                      {"BT": 16384, "dtype": "bfloat16"})]  # fmt: skip
    return [Sweep("cross_entropy", set_name, "V", "vocabulary", (37,), {"BT": 6, "dtype": "float32"})]


def _fused_linear_cross_entropy(set_name: str) -> list[Sweep]:
    op = "fused_linear_cross_entropy"
    if set_name in _NO_LOSS_SETS:
        return []
    if set_name == "seeds":
        return [Sweep(op, set_name, "BT", "tokens", _pow2(4096, 32768), {"H": 4096, "V": 128256, "dtype": "bfloat16"})]
    if set_name == "large":
        return [
            Sweep(op, set_name, "BT", "tokens", (4096, 8192), {"H": 2048, "V": v, "dtype": "bfloat16", "variant": name})
            for name, v in (("llama2_vocab", 32000), ("llama3_vocab", 128256))
        ]
    return [Sweep(op, set_name, "BT", "tokens", (6,), {"H": 8, "V": 37, "dtype": "float32"})]


_BUILDERS = {
    "cross_entropy": _cross_entropy,
    "fused_linear_cross_entropy": _fused_linear_cross_entropy,
    "poly_norm": _poly_norm,
    "rope": _rope,
    "group_norm": _group_norm,
    "group_norm_silu": lambda set_name: _group_norm(set_name, "group_norm_silu"),
    "rms_norm": lambda set_name: _row_norm("rms_norm", set_name),
    "layer_norm": lambda set_name: _row_norm("layer_norm", set_name),
}
_BUILDERS.update({op: lambda set_name, op=op: _glu(op, set_name) for op in GLU_OPS})
_BUILDERS.update({op: lambda set_name, op=op: _rope_variant(op, set_name) for op in ROPE_VARIANTS})


def _thin(values: tuple[int, ...]) -> tuple[int, ...]:
    if len(values) <= 3:
        return values
    return tuple(dict.fromkeys((values[0], values[len(values) // 2], values[-1])))


def sweeps(op: str, set_name: str, quick: bool = False) -> list[Sweep]:
    if op not in _BUILDERS:
        raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")
    if set_name not in SETS:
        raise ValueError(f"unknown set {set_name!r}; choose from {', '.join(SETS)}")
    out = _BUILDERS[op](set_name)
    if quick:
        thinned = []
        for s in out:
            xs = s.x_values[:2] if (op == "rope" and set_name == "large") else _thin(s.x_values)
            thinned.append(Sweep(s.op, s.set_name, s.x_name, s.x_label, xs, s.config))
        out = thinned
    return out


def num_groups(shape: dict[str, Any]) -> int:
    """group_norm's group count from either num_groups or channels_per_group."""
    if "num_groups" in shape:
        return int(shape["num_groups"])
    return int(shape["C"]) // int(shape["channels_per_group"])
