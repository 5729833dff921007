"""Shape sets per op.

A set is a list of sweeps; a sweep varies one dimension (``x_name``) over
``x_values`` with everything else fixed (``config``).  ``config`` goes into
each record's ``extra_benchmark_config_str`` as JSON.

Sets:

* ``seeds``: the upstream Liger-Kernel benchmark shapes.
    poly_norm   M=2048 rows, H in 256..4096, bf16
    rope        batch 1, 32 q / 8 kv heads, head_dim 256, seq 1024..16384, bf16
    group_norm  (M=128, C, H=512), 4 channels per group, C in 32..2048, fp32
* ``large``: shapes that keep an H200 busy.
    poly_norm   M=16384, H in {2048, 4096, 8192}, bf16
    rope        batch 4, otherwise as seeds
    group_norm  (8, 512, 4096), 32 groups, bf16 and fp32
* ``diffusion`` (group_norm only): Stable-Diffusion-style UNet / VAE
  activations, GroupNorm(32), bf16 and fp32:
    (2, 320, 64x64), (8, 640, 32x32), (16, 1280, 16x16), (4, 512, 128x128),
    (1, 128, 512x512)
  Each dtype is one sweep over C (every shape has its own C); the batch and
  image size of each C are in the config's ``points`` (C -> [N, h, w]), and
  the inputs are 4-D (N, C, h, w) as a UNet passes them.
* ``tiny``: interpreter-sized shapes for ``--device cpu`` smoke runs.
* ``tiny_diffusion``: the diffusion set's layout (4-D, per-C points) at
  interpreter size, so the CPU tests walk the same code.

Ops without a sweep in a set (poly_norm and rope in ``diffusion``) are
skipped in that set.  ``quick=True`` keeps the first, middle and last x of
each sweep (and for ``large`` rope only the two shortest sequences).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OPS = ("poly_norm", "rope", "group_norm")
SETS = ("seeds", "large", "diffusion", "tiny", "tiny_diffusion")
# What a run measures when --sets is not given.
DEFAULT_SETS = ("seeds", "large", "diffusion")
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
        """Short label distinguishing sweeps of one set (e.g. the dtype)."""
        return str(self.config.get("dtype", ""))


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
    else ``x_name=x``."""
    if "spatial" in shape:
        h, w = shape["spatial"]
        return f"({shape['M']}, {shape['C']}, {h}x{w})"
    return f"{x_name}={shape[x_name]}"


def _pow2(lo: int, hi: int) -> tuple[int, ...]:
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= 2
    return tuple(out)


def _poly_norm(set_name: str) -> list[Sweep]:
    if set_name in ("diffusion", "tiny_diffusion"):
        return []
    if set_name == "seeds":
        return [Sweep("poly_norm", set_name, "H", "hidden size", _pow2(256, 4096), {"M": 2048, "dtype": "bfloat16"})]
    if set_name == "large":
        return [Sweep("poly_norm", set_name, "H", "hidden size", (2048, 4096, 8192), {"M": 16384, "dtype": "bfloat16"})]
    return [Sweep("poly_norm", set_name, "H", "hidden size", (64,), {"M": 4, "dtype": "float32"})]


def _rope(set_name: str) -> list[Sweep]:
    if set_name in ("diffusion", "tiny_diffusion"):
        return []
    base = {"n_q_heads": 32, "n_kv_heads": 8, "head_dim": 256, "dtype": "bfloat16"}
    if set_name == "seeds":
        return [Sweep("rope", set_name, "T", "sequence length", _pow2(1024, 16384), {"B": 1, **base})]
    if set_name == "large":
        return [Sweep("rope", set_name, "T", "sequence length", _pow2(1024, 16384), {"B": 4, **base})]
    tiny = {"B": 1, "n_q_heads": 2, "n_kv_heads": 1, "head_dim": 8, "dtype": "float32"}
    return [Sweep("rope", set_name, "T", "sequence length", (4,), tiny)]


def _image_sweeps(
    set_name: str, points: dict[int, tuple[int, int, int]], num_groups: int, dtypes: tuple[str, ...]
) -> list[Sweep]:
    cfg_points = {str(c): list(points[c]) for c in sorted(points)}
    return [
        Sweep(
            "group_norm",
            set_name,
            "C",
            "num channels",
            tuple(sorted(points)),
            {"num_groups": num_groups, "dtype": dt, "points": cfg_points},
        )
        for dt in dtypes
    ]


def _group_norm(set_name: str) -> list[Sweep]:
    if set_name == "diffusion":
        return _image_sweeps(set_name, DIFFUSION_POINTS, 32, ("bfloat16", "float32"))
    if set_name == "tiny_diffusion":
        return _image_sweeps(set_name, TINY_DIFFUSION_POINTS, 4, ("float32",))
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
    return [
        Sweep("group_norm", set_name, "C", "num channels", (8,), {"M": 2, "H": 4, "num_groups": 2, "dtype": "float32"})
    ]


_BUILDERS = {"poly_norm": _poly_norm, "rope": _rope, "group_norm": _group_norm}


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
