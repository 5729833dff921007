"""cross_entropy's launch on the GPU at the seeds' vocabularies: forward and
backward time of the shipped plan against other column blocks and warp
counts, and torch.compile of the same math (BT = 4096 rows, bf16 logits,
mean reduction, no options).

    python -m bench.lab.probe_ce_warps [--out probe_ce_warps.md]

The op table at 6b87ace (bench/lab/NOTES.md v28) had cross_entropy at V
4096 in 77 us forward against compile's 48 (33.5 MB of logits: 11 us at the
HBM's rate), level with compile at 32768 and ahead from 128k.  The plan
gives every row of more than 2048 classes one program of 32 warps, upstream
Liger-Kernel's launch for long rows: at 4096 classes that is 4 elements a
thread and two block-wide reductions a row.  Candidates, through
``launch.forward`` / ``launch.backward`` with a hand-built Plan (one
program per row):

* ``plan``: what ``plan.cuda`` ships;
* ``bB/wW``: column blocks of B elements, W warps;
* ``compile``: torch.compile of the loss (forward) and of the logits'
  gradient (backward), Inductor's own kernels.

Time: median of CUDA-graph replays (GPU time only); TB/s: the logits read
(forward), read and written (backward), over that time.  Reading the
table: the fastest candidate per vocabulary in both directions, if it beats
compile's, is what plan.cuda should pick there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.lab.probe_group_norm import candidate_row, run_table_probe

ROWS = 4096
VOCABULARIES = (4096, 8192, 16384, 32768, 131072)
WARPS = (4, 8, 16, 32)
# Largest error relative to max |reference| the float32 loss or the bf16 gradient may have.
ERROR_BOUND = 2e-2


def _plans(n_rows: int, n_cols: int):
    from csrc_free_ops.cross_entropy import plan
    from csrc_free_ops.cross_entropy.plan import Plan
    from csrc_free_ops.host_math import next_pow2

    yield "plan", plan.cuda(n_rows, n_cols)
    whole = min(next_pow2(n_cols), plan.MAX_BLOCK_N)
    for block in sorted({whole, min(whole, 8192)}):
        for warps in WARPS:
            yield f"b{block}/w{warps}", Plan(block, n_rows, warps)


def _loss(logits, target):
    return F.cross_entropy(logits.float(), target)


def _gradient(logits, target):
    """The mean loss's gradient with respect to the logits, written out (what Inductor fuses)."""
    p = torch.softmax(logits.float(), -1)
    onehot = F.one_hot(target, logits.shape[-1]).float()
    return ((p - onehot) / logits.shape[0]).to(logits.dtype)


def _compiled():
    return torch.compile(_loss, fullgraph=True), torch.compile(_gradient, fullgraph=True)


def _candidates(logits, target, lse, compile_too: bool = True):
    from csrc_free_ops.cross_entropy import launch
    from csrc_free_ops.cross_entropy.reference import Options

    o = Options(-100, 0.0, "mean", 0.0, None)
    grad_loss = torch.ones((), device=logits.device)
    for label, p in _plans(*logits.shape):
        yield label, "fwd", lambda p=p: (launch.forward(logits, target, None, o, p)[0],)
        yield label, "bwd", lambda p=p: (launch.backward(grad_loss, logits, target, lse, None, o, p),)
    if compile_too:
        fwd, bwd = _compiled()
        yield "compile", "fwd", lambda: (fwd(logits, target),)
        yield "compile", "bwd", lambda: (bwd(logits, target),)


def _references(logits, target):
    x64 = logits.double().requires_grad_()
    loss = F.cross_entropy(x64, target)
    (grad,) = torch.autograd.grad(loss, x64)
    return {"fwd": (loss.detach(),), "bwd": (grad,)}, torch.logsumexp(logits.float(), -1)


def probe(n_cols: int, rep: int) -> list[str]:
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(ROWS, n_cols, device="cuda", generator=g).bfloat16()
    target = torch.randint(0, n_cols, (ROWS,), device="cuda", generator=g)
    refs, lse = _references(logits, target)
    moved = {"fwd": logits.numel() * logits.element_size(), "bwd": 2 * logits.numel() * logits.element_size()}
    return [
        candidate_row(f"{n_cols} | {direction} | {label}", fn, refs[direction], moved[direction], rep, ERROR_BOUND)
        for label, direction, fn in _candidates(logits, target, lse)
    ]


def _table(rep: int) -> tuple[list[str], list[str]]:
    head = [f"# cross_entropy blocks and warps: {torch.cuda.get_device_name()}, BT={ROWS}, bf16", "",
            "| V | dir | candidate | ok | graph us | TB/s |", "|---|---|---|---|---|---|"]  # fmt: skip
    print("\n".join(head), flush=True)
    return head, [line for n_cols in VOCABULARIES for line in probe(n_cols, rep)]


def main(argv: list[str] | None = None) -> int:
    return run_table_probe("bench.lab.probe_ce_warps", __doc__, "probe_ce_warps.md", 50, argv, _table)


if __name__ == "__main__":
    raise SystemExit(main())
