"""rope's patch-time check: a drop-in against the original rotary function on tiny float32 CPU inputs."""

from __future__ import annotations

from collections.abc import Callable

import torch

from liger_nn.patching.checks import Skip, close
from liger_nn.patching.rope_table import RotaryConvention


def _rope_check_cases(convention: RotaryConvention) -> list[tuple[tuple, dict]]:
    """Tiny float32 CPU inputs: (B, H, S, D) q and k with (B, S, R) tables, and
    (B, S, H, D) with unsqueeze_dim=2; or (T, H, D) with (T, R) for packed
    tokens.  R = D, and R < D too for partial conventions.  Random tables
    (not cos/sin of angles): each table entry must be used where the original
    uses it.  D = 10: a head_dim that is no power of two."""
    gen = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=gen)
    head_dim = 10
    widths = (head_dim, 4) if convention.partial else (head_dim,)
    cases: list[tuple[tuple, dict]] = []
    for rot in widths:
        if convention.packed:
            cases.append(((rand(6, 3, head_dim), rand(6, 1, head_dim), rand(6, rot), rand(6, rot)), {}))
            continue
        q, k, cos, sin = rand(2, 3, 3, head_dim), rand(2, 1, 3, head_dim), rand(2, 3, rot), rand(2, 3, rot)
        cases.append(((q, k, cos, sin), {}))
        cases.append(((q.transpose(1, 2), k.transpose(1, 2), cos, sin), {"unsqueeze_dim": 2}))
    return cases


def check_rope(original: Callable, replacement: Callable, convention: RotaryConvention) -> None:
    """Raise Skip unless ``replacement`` gives ``original``'s q and k on every case of the convention."""
    for args, kwargs in _rope_check_cases(convention):
        try:
            expected = original(*args, **kwargs)
            got = replacement(*args, **kwargs)
        except Exception as exc:  # the original may not support a layout; that is a mismatch too
            raise Skip(f"patch-time check raised {type(exc).__name__}: {exc}") from None
        if not all(close(g, e) for g, e in zip(got, expected, strict=True)):
            raise Skip("patch-time check: the op's output differs from the original function's")
