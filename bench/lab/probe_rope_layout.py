"""rope's CUDA plan on q and k as models hand them over (HF's (B, S, H, D)
projections viewed (B, H, S, D)): warps per program x rows per program,
against upstream Liger-Kernel's kernel, GPU time (CUDA-graph replay, L2
flushed before every call).

    python -m bench.lab.probe_rope_layout                # ~3 minutes on the H200 (Triton compiles included)
    python -m bench.lab.probe_rope_layout --shapes 0,1,2 # a subset (indices into the list below)
    python -m bench.lab.probe_rope_layout --quick        # shipped plan and upstream only

Shapes: the model_layout set (bench/shapes.py MODEL_LAYOUT_SHAPES), the
packed case as its (1, 16384, 32/8, 128) tensors, and the seeds shape
(1, 4096, 32/8, 256) whose 20 KiB rows the one-warp plan was swept on.
Directions: ``fwd_`` in place (the patch's forward), ``bwd`` the transposed
rotation of a gradient in the same layout (out of place, the in-place
path's backward).  Each candidate goes through ``launch.rotate`` with a
hand-built Plan; ``plan`` marks what ``plan.cuda`` ships.  Upstream:
``rope_forward`` / ``rope_backward`` of liger_kernel.ops.rope (both in place).

What to set in csrc_free_ops/rope/plan.py from the table: ADJACENT_WARPS and
ADJACENT_ROWS from the fastest candidate over the small-row shapes (the
sum of their times), and ADJACENT_ROW_BYTES above the largest row where
that candidate beats one warp (the seeds shape must keep one warp unless
it loses there).
"""

from __future__ import annotations

import argparse
import sys

import torch

from bench import shapes, timing
from bench.providers import rope_tables

CANDIDATES = ((1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (2, 2), (4, 2))  # (warps, rows per program)


def _shapes() -> list[tuple[str, int, int, int, int, int]]:
    out = [(name, *dims) for name, dims in shapes.MODEL_LAYOUT_SHAPES.items()]
    out.append(("packed_as_1x16384", 1, 32, 8, 128, sum(shapes.PACKED_DOC_LENS)))
    out.append(("seeds_b1_h32_kv8_d256", 1, 32, 8, 256, 4096))
    return out


def _inputs(b, hq, hkv, d, s):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, s, hq, d, device="cuda", generator=g).to(torch.bfloat16).transpose(1, 2)
    k = torch.randn(b, s, hkv, d, device="cuda", generator=g).to(torch.bfloat16).transpose(1, 2)
    cos, sin = rope_tables(s, d, "cuda", torch.bfloat16)
    return q, k, cos, sin


def _ms(make) -> float:
    return timing.time_ms(make, "cuda", "graph", 10.0, 50.0)[0]


def _ours(q, k, cos, sin, p, direction):
    from csrc_free_ops.rope import launch

    if direction == "fwd_":
        return lambda: lambda: launch.rotate(q, k, q, k, cos, sin, p, backward=False)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    return lambda: lambda: launch.rotate(q, k, q_out, k_out, cos, sin, p, backward=True)


def _upstream(q, k, cos, sin, direction):
    from liger_kernel.ops import rope as up

    fn = up.rope_forward if direction == "fwd_" else up.rope_backward
    return lambda: lambda: fn(q, k, cos, sin)


def _check(q, k, cos, sin, p) -> float:
    """Largest error of the in-place forward against float64, relative to max |reference|."""
    from csrc_free_ops.rope import launch, reference

    qi, ki = torch.empty_like(q).copy_(q), torch.empty_like(k).copy_(k)  # q's and k's layout
    want = reference.forward(q.double(), k.double(), cos.double(), sin.double())
    launch.rotate(qi, ki, qi, ki, cos, sin, p, backward=False)
    return max(((o.double() - w).abs().max() / w.abs().max()).item() for o, w in zip((qi, ki), want, strict=True))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.lab.probe_rope_layout", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the shipped plan and upstream only")
    ap.add_argument("--shapes", default=None, help="comma list of shape indices (default: all 7)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    import registrations  # noqa: F401
    from csrc_free_ops.rope import launch, plan

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; GPU time in us (graph replay, L2 flushed)")
    print("shape | dir | candidate (warps x rows) | us | vs upstream | err")
    print("---|---|---|---|---|---")
    totals: dict[tuple[str, int, int], float] = {}
    chosen = _shapes()
    if args.shapes:
        chosen = [chosen[int(i)] for i in args.shapes.split(",")]
    for name, b, hq, hkv, d, s in chosen:
        q, k, cos, sin = _inputs(b, hq, hkv, d, s)
        shipped = launch._cuda_plan(q, k, cos, sin, None, None, False)
        rows = b * s
        for direction in ("fwd_", "bwd"):
            try:
                up_us = _ms(_upstream(q, k, cos, sin, direction)) * 1e3
            except Exception as e:  # not installed, or a triton mismatch inside it
                up_us = float("nan")
                print(f"{name} | {direction} | upstream | skipped: {type(e).__name__}: {str(e)[:80]} | | ")
            else:
                print(f"{name} | {direction} | upstream | {up_us:.2f} | 1.000 |")
            cands = [(shipped.num_warps, shipped.rows_per_program)] if args.quick else CANDIDATES
            for warps, per in cands:
                p = plan.Plan(shipped.block_qh, shipped.block_kh, -(-rows // per), warps, shipped.block_seqs, True, per)
                err = _check(q, k, cos, sin, p) if direction == "fwd_" else float("nan")
                us = _ms(_ours(q, k, cos, sin, p, direction)) * 1e3
                mark = " (plan)" if (warps, per) == (shipped.num_warps, shipped.rows_per_program) else ""
                print(f"{name} | {direction} | {warps} x {per}{mark} | {us:.2f} | {up_us / us:.3f} | {err:.1e}")
                if d <= 128:
                    totals[(direction, warps, per)] = totals.get((direction, warps, per), 0.0) + us
            sys.stdout.flush()
        del q, k, cos, sin
        timing.free("cuda")
    if totals:
        print("\nsum over the head_dim <= 128 shapes (us), per direction:")
        for direction in ("fwd_", "bwd"):
            ranked = sorted((t, w, r) for (dd, w, r), t in totals.items() if dd == direction)
            print(f"  {direction}: " + ", ".join(f"{w}x{r} {t:.1f}" for t, w, r in ranked))
    return 0


if __name__ == "__main__":
    sys.exit(main())
