"""fused_linear_cross_entropy's chunk size on the GPU: forward+backward time
and peak memory per chunk height, beside upstream Liger-Kernel's and
torch.compile's linear + cross_entropy, at the LLM step shapes (bf16).

    python -m bench.lab.probe_flce_chunks [--out probe_flce_chunks.md]

Each chunk of ``rows`` rows costs matmuls whose shapes depend on it:
the logits (rows x V) from x_chunk @ weight.T, reading the whole weight per
chunk; grad_x's rows, reading it again; and grad_weight += g.T @ x_chunk,
which reads and writes the whole (V, H) accumulator per chunk with an inner
dimension of only ``rows``.  Short chunks make the last one memory-bound
(arithmetic intensity about rows / 2 FLOP per byte of a bf16 accumulator,
against about 300 for an H100's tensor cores).  Candidates:

* ``plan``: what ``plan.cuda`` ships, the way a training step runs it:
  where its backward walks the rows, ``launch.forward_with_grads`` (three
  matmuls a chunk), then the gradients scaled by grad_loss; where it walks
  the classes, ``launch.forward`` then ``launch.backward`` (the class walk);
* ``rows/R``: the one walk with chunks of R rows (a hand-built Plan);
* ``recompute/plan``, ``recompute/R``: ``launch.forward`` then
  ``launch.backward`` walking the rows (the plan's chunk height, or R),
  which computes the logits again (four matmuls a chunk);
* ``classes/C``: ``launch.forward``, then ``launch.backward_by_classes``
  walking C classes at a time (C x BT logits: the memory of the plan's
  chunk, then of each R above), grad_weight written once per slice;
* ``upstream``: liger_kernel's LigerFusedLinearCrossEntropyFunction (which
  computes the gradients in its forward);
* ``compile``: torch.compile of F.cross_entropy(F.linear(x, w), t).

Time: median ms of forward + backward (triton's do_bench, eager: every
candidate's launches included).  Peak: torch.cuda.max_memory_allocated over
one forward + backward, above the inputs.  Then the shipped plan's kernels
by GPU time (torch.profiler), which says which matmul a chunk height costs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.lab.probe_group_norm import do_bench_ms, run_table_probe

# (BT, H, V): Llama B8 S512 and B2 S4096 at 32k, Llama 3's vocabulary at B2 S4096 (bench.steps' shapes)
SHAPES = ((4096, 2048, 32000), (8192, 2048, 32000), (8192, 2048, 128256))
CHUNK_ROWS = (256, 512, 1024, 2048)
TOP = 8


def _inputs(rows: int, hidden: int, n_classes: int, device: str = "cuda", dtype: torch.dtype = torch.bfloat16):
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, hidden, device=device, generator=g).to(dtype)
    w = (torch.randn(n_classes, hidden, device=device, generator=g) / hidden**0.5).to(dtype)
    t = torch.randint(0, n_classes, (rows,), device=device, generator=g)
    return x, w, t


def _ours(x, w, t, chunk_rows: int | None, one_walk: bool = False):
    from csrc_free_ops.cross_entropy import plan as ce_plan
    from csrc_free_ops.cross_entropy.reference import Options
    from csrc_free_ops.fused_linear_cross_entropy import launch, plan

    rows = launch._cuda_plan(x, w).chunk_rows if chunk_rows is None else chunk_rows
    p = plan.Plan(rows, ce_plan.cuda(rows, w.shape[0]))  # a row walk
    o = Options()
    one = torch.ones((), device=x.device)

    def fwd_bwd():
        loss, _, lse = launch.forward(x, w, t, None, None, o, p)
        return loss, *launch.backward(one, x, w, t, lse, None, None, o, (True, True, False), p)[:2]

    def with_grads():
        loss, _, _, grad_x, grad_w, _ = launch.forward_with_grads(x, w, t, None, None, o, (True, True, False), p)
        return loss, grad_x.mul_(one), grad_w.mul_(one)  # the formula's scaling by grad_loss

    return (with_grads if one_walk else fwd_bwd), p.chunk_rows


def _shipped(x, w, t):
    """The shipped plan as a training step runs it (module doc), and its name."""
    from csrc_free_ops.cross_entropy.reference import Options
    from csrc_free_ops.fused_linear_cross_entropy import launch

    p = launch._cuda_plan(x, w)
    if not p.class_slice:
        return _ours(x, w, t, p.chunk_rows, one_walk=True)[0], f"plan ({p.chunk_rows} rows, one walk)"
    o, one = Options(), torch.ones((), device=x.device)

    def fwd_bwd():
        loss, _, lse = launch.forward(x, w, t, None, None, o, p)
        return loss, *launch.backward(one, x, w, t, lse, None, None, o, (True, True, False), p)[:2]

    return fwd_bwd, f"plan ({p.chunk_rows} rows, classes/{p.class_slice})"


def _autograd(loss_fn, x, w, t):
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()

    def fwd_bwd():
        loss = loss_fn(xg, wg, t)
        return loss, *torch.autograd.grad(loss, (xg, wg))

    return fwd_bwd


def _by_classes(x, w, t, class_slice: int):
    """The forward's row walk (the shipped plan), then the backward walking the classes."""
    from csrc_free_ops.cross_entropy import plan as ce_plan
    from csrc_free_ops.cross_entropy.reference import Options
    from csrc_free_ops.fused_linear_cross_entropy import launch

    p, o, one = launch._cuda_plan(x, w), Options(), torch.ones((), device=x.device)
    ce_p = ce_plan.cuda(x.shape[0], class_slice)

    def fwd_bwd():
        loss, _, lse = launch.forward(x, w, t, None, None, o, p)
        return loss, *launch.backward_by_classes(one, x, w, t, lse, None, None, o, (True, True, False), class_slice,
                                                 ce_p)[:2]  # fmt: skip

    return fwd_bwd


def _class_slice(rows: int, n_rows: int, n_classes: int) -> int:
    """The slice of classes whose logits for all rows hold as many elements as ``rows`` rows' logits."""
    from csrc_free_ops.fused_linear_cross_entropy.plan import CLASS_MULTIPLE

    return max(CLASS_MULTIPLE, rows * n_classes // n_rows // CLASS_MULTIPLE * CLASS_MULTIPLE)


def _ours_candidates(x, w, t):
    fn, name = _shipped(x, w, t)
    yield name, fn
    for rows in CHUNK_ROWS:
        yield f"rows/{rows}", _ours(x, w, t, rows, one_walk=True)[0]
    for rows in (None, *CHUNK_ROWS):
        yield f"recompute/{rows or 'plan'}", _ours(x, w, t, rows)[0]
    plan_rows = _ours(x, w, t, None)[1]
    for rows in (plan_rows, *(r for r in CHUNK_ROWS if r != plan_rows)):
        class_slice = _class_slice(rows, x.shape[0], w.shape[0])
        yield f"classes/{class_slice}", _by_classes(x, w, t, class_slice)


def _candidates(x, w, t):
    yield from _ours_candidates(x, w, t)
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction as Up
    except ImportError:
        pass
    else:
        yield (
            "upstream",
            _autograd(lambda a, b, c: Up.apply(a, b, c, None, None, -100, 0.0, 0.0, "mean", None, False)[0], x, w, t),
        )
    yield "compile", _autograd(torch.compile(lambda a, b, c: F.cross_entropy(F.linear(a, b), c)), x, w, t)


def _peak_mb(fn) -> float:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    del out
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _kernels(fn) -> list[str]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from bench.steps import top_kernels

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == DeviceType.CUDA]
    return [f"  - {k['ms']:.3f} ms, {k['calls']:g} calls: `{k['name']}`" for k in top_kernels(events, 1, TOP)]


def probe(shape: tuple[int, int, int], rep: int) -> tuple[list[str], list[str]]:
    x, w, t = _inputs(*shape)
    label = "BT{} H{} V{}".format(*shape)
    rows, notes = [], []
    reference = None
    first_classes = None
    for name, fn in _candidates(x, w, t):
        if name.startswith("classes/") and first_classes is None:
            first_classes = name  # the slice holding the plan's chunk of logits
        try:
            loss = fn()[0].float().item()
            reference = loss if reference is None else reference
            ms = do_bench_ms(fn, rep)
            peak = _peak_mb(fn)
        except Exception as e:  # noqa: BLE001 - a candidate that fails is a row, not the end
            rows.append(f"| {label} | {name} | {type(e).__name__}: {str(e)[:60]} | - | - |")
        else:
            rows.append(f"| {label} | {name} | {loss - reference:+.1e} | {ms:.2f} | {peak:.0f} |")
            if name.startswith(("plan", "recompute/plan")) or name == first_classes:
                notes += [f"- {label}, {name}:", *_kernels(fn)]
        print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    return rows, notes


def _table(rep: int) -> tuple[list[str], list[str]]:
    head = [f"# fused_linear_cross_entropy chunk heights: {torch.cuda.get_device_name()}, bf16, fwd+bwd", "",
            "| shape | candidate | loss - plan's | ms | peak MB |", "|---|---|---|---|---|"]  # fmt: skip
    print("\n".join(head), flush=True)
    lines, notes = [], ["", "The shipped plan's kernels by GPU time, one forward + backward:", ""]
    for shape in SHAPES:
        rows, kernel_notes = probe(shape, rep)
        lines += rows
        notes += kernel_notes
    print("\n".join(notes), flush=True)
    return head, lines + notes


def main(argv: list[str] | None = None) -> int:
    return run_table_probe("bench.lab.probe_flce_chunks", __doc__, "probe_flce_chunks.md", 200, argv, _table)


if __name__ == "__main__":
    raise SystemExit(main())
