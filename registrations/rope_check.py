"""rope's argument checks: shapes, dtypes, devices and options (once per argument signature), the
memory in-place rotation would corrupt, and the positions against the tables on the CPU."""

from __future__ import annotations

import torch

from csrc_free_ops.rope import RopeOptions, launch
from registrations import _checks, overlap

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


def check(op, q, k, cos, sin, options: RopeOptions, names=("q", "k")) -> None:
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


def check_in_place(op: str, q: torch.Tensor | None, k: torch.Tensor | None) -> None:
    """Memory that in-place rotation would corrupt, from q's and k's shapes and strides alone:
    an element addressed twice.  Exact on real and fake tensors (registrations/overlap.py)."""
    for name, t in (("q", q), ("k", k)):
        if t is not None and overlap.self_overlapping(t):
            raise ValueError(f"{op}: {name} has internally overlapping memory (e.g. an expanded view)")


def check_apart(op: str, q: torch.Tensor | None, k: torch.Tensor | None) -> None:
    """q and k share no element (it depends on where they lie: checked on every call)."""
    if q is not None and k is not None and overlap.overlapping(q, k):
        raise ValueError(f"{op}: q and k overlap in memory; rotating one in place would change the other")


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
