"""The row norms' plans for wide rows on the GPU: whole-row tiles against
the column-blocked kernels, forward and backward, checked against float64
and timed as CUDA-graph replays (GPU time only), at the harness's seeds rows
(rms_norm: 2048 rows, Llama's casting; layer_norm: 4096 rows with weight and
bias; bf16).

    python -m bench.lab.probe_rms_norm_wide [--out probe_rms_norm_wide.md]

Rows wider than csrc_free_ops/rms_norm/plan.py's MAX_ROW_BLOCK take the
column-blocked kernels, which read each row twice (once for its mean
square, once to normalize).  Upstream holds rows of up to 64k elements in
registers.  Candidates, each through ``launch.forward`` / ``launch.backward``
with a hand-built Plan:

* ``plan``: what ``plan.cuda`` ships;
* ``whole/wW``: one whole row per program, W warps (the backward with its
  shipped program count and pipelining);
* ``blocked/B/wW``: the column-blocked kernels with B-column blocks.

The rivals at the same rows (liger_kernel, torch.compile) are in the op
table (``python -m bench.run --ops rms_norm,layer_norm --sets seeds``); at
821e485 (bench/lab/NOTES.md v25) it had layer_norm's whole 16384-wide
backward at 0.53x compile's speed and rms_norm's blocked 32768-wide one at
0.54x.  Reading the
table: MAX_ROW_BLOCK (per direction if they differ) is the widest row at
which a ``whole`` variant beats every ``blocked`` one, and its warps are
what ``_cuda_warps`` must give for that tile.
"""

from __future__ import annotations

import torch

from bench.lab.probe_group_norm import candidate_row, run_table_probe

# op: (rows, widths, mean subtracted with a bias (LayerNorm), or Llama's casting (RMSNorm))
OPS = {"rms_norm": (2048, (8192, 16384, 32768), False), "layer_norm": (4096, (4096, 8192, 16384), True)}
WHOLE_WARPS = (8, 16, 32)
BLOCKED = ((4096, 8), (4096, 16), (8192, 16))
# Largest error relative to max |reference| a bf16 output may have (its rounding, a few ulps).
ERROR_BOUND = 2e-2


def _candidates(n_rows: int, n_cols: int, backward: bool, sms: int):
    from csrc_free_ops.rms_norm import plan
    from csrc_free_ops.rms_norm.plan import Plan

    shipped = plan.cuda(n_rows, n_cols, backward, sms, 2)
    yield "plan", shipped
    # at these widths the shipped plan holds one row per program: its program count serves every variant
    programs = shipped.programs
    stages = plan.BWD_LOOP_STAGES if backward else None
    for warps in WHOLE_WARPS:
        yield f"whole/w{warps}", Plan(True, 1, plan.next_pow2(n_cols), programs, warps, stages)
    for block, warps in BLOCKED:
        yield f"blocked/{block}/w{warps}", Plan(False, 1, block, programs, warps)


def norm_of(op: str, eps: float):
    """The op's RowNorm: LayerNorm subtracts the mean, Llama's RMSNorm rounds the normalized x."""
    from csrc_free_ops.rms_norm.launch import RowNorm

    center = OPS[op][2]
    return RowNorm(eps, 0.0, center, not center)


def _reference(x, w, b, dy, norm):
    """(y, (dx, dw[, db])) in float64."""
    from csrc_free_ops.rms_norm import reference

    x64, w64 = x.double().requires_grad_(True), w.double().requires_grad_(True)
    b64 = None if b is None else b.double().requires_grad_(True)
    y = reference.row_norm_forward(x64, w64, b64, norm.eps, 0.0, norm.center, norm.round_normed)
    wrt = (x64, w64) if b64 is None else (x64, w64, b64)
    return y.detach(), torch.autograd.grad(y, wrt, dy.double())


def inputs(op: str, n_rows: int, n_cols: int, device: str):
    """x, weight, bias (layer_norm's only) and dy, bf16."""
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n_rows, n_cols, device=device, generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(n_cols, device=device, generator=g)).bfloat16()
    b = (0.1 * torch.randn(n_cols, device=device, generator=g)).bfloat16() if OPS[op][2] else None
    dy = torch.randn(n_rows, n_cols, device=device, generator=g).bfloat16()
    return x, w, b, dy


def probe(op: str, n_cols: int, sms: int, rep: int) -> list[str]:
    """The table's rows of one op at one width, both directions."""
    from csrc_free_ops.rms_norm import launch

    n_rows = OPS[op][0]
    x, w, b, dy = inputs(op, n_rows, n_cols, "cuda")
    norm = norm_of(op, 1e-6)
    y_ref, grads_ref = _reference(x, w, b, dy, norm)
    n_grads = len(grads_ref)
    lines = []
    for backward in (False, True):
        direction = "bwd" if backward else "fwd"
        # minimal bytes: forward x and y, backward x, dy and dx (the weight rows are negligible here)
        moved = (3 if backward else 2) * x.numel() * x.element_size()
        for name, p in _candidates(n_rows, n_cols, backward, sms):
            if backward:
                fn = lambda p=p: launch.backward(dy, x, w, b, norm, p)[:n_grads]  # noqa: E731
                refs = grads_ref
            else:
                fn = lambda p=p: (launch.forward(x, w, b, norm, p),)  # noqa: E731
                refs = (y_ref,)
            lines.append(candidate_row(f"{op} | {n_cols} | {direction} | {name}", fn, refs, moved, rep, ERROR_BOUND))
    return lines


def _table(rep: int) -> tuple[list[str], list[str]]:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = ", ".join(f"{op} {n_rows} rows" for op, (n_rows, _, _) in OPS.items())
    head = [f"# row norms, wide rows: {torch.cuda.get_device_name()}, {sms} SMs, {rows}, bf16", "",
            "| op | H | dir | candidate | ok | graph us | TB/s |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    print("\n".join(head), flush=True)
    return head, [
        line for op, (_, widths, _) in OPS.items() for n_cols in widths for line in probe(op, n_cols, sms, rep)
    ]


def main(argv: list[str] | None = None) -> int:
    return run_table_probe("bench.lab.probe_rms_norm_wide", __doc__, "probe_rms_norm_wide.md", 50, argv, _table)


if __name__ == "__main__":
    raise SystemExit(main())
