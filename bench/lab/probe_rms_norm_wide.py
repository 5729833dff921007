"""rms_norm plans for wide rows on the GPU: whole-row tiles against the
column-blocked kernels, forward and backward, checked against float64 and
timed as CUDA-graph replays (GPU time only), at the harness's seeds rows
(2048 rows, bf16, Llama's casting).

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
table (``python -m bench.run --ops rms_norm --sets seeds``).  Reading the
table: MAX_ROW_BLOCK (per direction if they differ) is the widest row at
which a ``whole`` variant beats every ``blocked`` one, and its warps are
what ``_cuda_warps`` must give for that tile.
"""

from __future__ import annotations

import torch

from bench.lab.probe_group_norm import graph_ms, max_rel_error, run_table_probe

ROWS = 2048
WIDTHS = (8192, 16384, 32768)
WHOLE_WARPS = (8, 16, 32)
BLOCKED = ((4096, 8), (4096, 16), (8192, 16))
# Largest error relative to max |reference| a bf16 output may have (its rounding, a few ulps).
ERROR_BOUND = 2e-2


def _candidates(n_cols: int, backward: bool, sms: int):
    from csrc_free_ops.rms_norm import plan
    from csrc_free_ops.rms_norm.plan import Plan

    shipped = plan.cuda(ROWS, n_cols, backward, sms, 2)
    yield "plan", shipped
    # at these widths the shipped plan holds one row per program: its program count serves every variant
    programs = shipped.programs
    stages = plan.BWD_LOOP_STAGES if backward else None
    for warps in WHOLE_WARPS:
        yield f"whole/w{warps}", Plan(True, 1, plan.next_pow2(n_cols), programs, warps, stages)
    for block, warps in BLOCKED:
        yield f"blocked/{block}/w{warps}", Plan(False, 1, block, programs, warps)


def _reference(x, w, dy, eps):
    from csrc_free_ops.rms_norm import reference

    x64 = x.double().requires_grad_(True)
    w64 = w.double().requires_grad_(True)
    y = reference.row_norm_forward(x64, w64, None, eps, 0.0, False, True)
    dx, dw = torch.autograd.grad(y, (x64, w64), dy.double())
    return y.detach(), dx, dw


def probe(n_cols: int, sms: int, rep: int) -> list[str]:
    """The table's rows at one width, both directions."""
    from csrc_free_ops.rms_norm import launch
    from csrc_free_ops.rms_norm.launch import RowNorm

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(ROWS, n_cols, device="cuda", generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(n_cols, device="cuda", generator=g)).bfloat16()
    dy = torch.randn(ROWS, n_cols, device="cuda", generator=g).bfloat16()
    eps = 1e-6
    norm = RowNorm(eps, 0.0, False, True)
    y_ref, dx_ref, dw_ref = _reference(x, w, dy, eps)
    lines = []
    for backward in (False, True):
        direction = "bwd" if backward else "fwd"
        # minimal bytes: forward x and y, backward x, dy and dx (the weight rows are negligible here)
        moved = (3 if backward else 2) * x.numel() * x.element_size()
        for name, p in _candidates(n_cols, backward, sms):
            if backward:
                fn = lambda p=p: launch.backward(dy, x, w, None, norm, p)[:2]  # noqa: E731
                refs = (dx_ref, dw_ref)
            else:
                fn = lambda p=p: (launch.forward(x, w, None, norm, p),)  # noqa: E731
                refs = (y_ref,)
            try:
                err = max_rel_error(fn(), refs)
                ms = graph_ms(fn, rep)
            except Exception as e:  # noqa: BLE001 - a variant that fails to build is a row, not the end
                lines.append(f"| {n_cols} | {direction} | {name} | {type(e).__name__} | - | - |")
            else:
                ok = f"ok ({err:.1e})" if err <= ERROR_BOUND else f"WRONG ({err:.1e})"
                lines.append(f"| {n_cols} | {direction} | {name} | {ok} | {ms * 1e3:.1f} | {moved / ms / 1e9:.2f} |")
            print(lines[-1], flush=True)
    return lines


def _table(rep: int) -> tuple[list[str], list[str]]:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    head = [f"# rms_norm wide rows: {torch.cuda.get_device_name()}, {sms} SMs, {ROWS} rows, bf16", "",
            "| H | dir | candidate | ok | graph us | TB/s |", "|---|---|---|---|---|---|"]  # fmt: skip
    print("\n".join(head), flush=True)
    return head, [line for n_cols in WIDTHS for line in probe(n_cols, sms, rep)]


def main(argv: list[str] | None = None) -> int:
    return run_table_probe("bench.lab.probe_rms_norm_wide", __doc__, "probe_rms_norm_wide.md", 50, argv, _table)


if __name__ == "__main__":
    raise SystemExit(main())
