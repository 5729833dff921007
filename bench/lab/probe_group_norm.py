"""group_norm plans on the GPU: every candidate plan checked against a
float64 reference and timed beside torch eager and torch.compile, at the
diffusion shapes and the large one, bf16 and fp32, 32 groups.

    python -m bench.lab.probe_group_norm                 # everything (~6-8 minutes on the H200)
    python -m bench.lab.probe_group_norm --quick         # the shipped plan, its fallback and the rivals only
    python -m bench.lab.probe_group_norm --shapes 0,5 --no-compile

Timings are do_bench medians with L2 flushed before every call: ``graph`` is
a CUDA-graph replay of the call (GPU time only, the harness's default timer),
``eager`` the plain call (host cost included).  Candidates run through
``launch.forward`` / ``launch.backward`` with a hand-built Plan (no
autograd); ``op`` is ``torch.ops.liger.group_norm`` through autograd, as a
user calls it (eager only differs from the candidates by the host path).
TB/s counts minimal bytes (bench/lab/NOTES.md: forward 2*x + 2*C*4, backward
3*x + 3*C*4).  ``ok`` is the largest error relative to max |reference| of
every output against float64, within the dtype's bound.

Candidates per (shape, dtype, direction):

* ``plan``: what ``plan.cuda`` ships (its path, and for one-pass plans the
  tile, warps, prefetch, and the teams the launch kept resident);
* ``1p/T/wW/pf``: one-pass with tiles of T elements, W warps, prefetch on/off;
* ``looped`` / ``split``: the two-walk plans (the one-pass fallbacks).

What to retune in csrc_free_ops/group_norm/plan.py from the table: see the
"reading the table" lines printed at the end.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

SHAPES = [  # (N, C, H, W): the diffusion set, then the large one as (N, C, L)
    (2, 320, 64, 64),
    (8, 640, 32, 32),
    (16, 1280, 16, 16),
    (4, 512, 128, 128),
    (1, 128, 512, 512),
    (8, 512, 4096),
    (4, 960, 64, 64),  # SD 1.5 UNet B4's widest 64x64 norm, where plan.cuda takes one-pass (v30)
]
GROUPS = 32
EPS = 1e-5
TOLERANCE = {torch.bfloat16: 3e-2, torch.float32: 1e-4}
ONE_PASS_SWEEP = {
    False: ((8192, 4), (4096, 4), (2048, 4), (4096, 8)),
    True: ((4096, 4), (2048, 4), (1024, 4), (4096, 8)),
}


def do_bench_ms(fn, rep: int) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10, rep=rep, return_mode="median"))


def run_table_probe(
    module: str, doc: str, out: str, rep: int, argv: list[str] | None,
    table: Callable[[int], tuple[list[str], list[str]]],
) -> int:  # fmt: skip
    """A markdown-table probe's command line and run: ``python -m <module> [--out OUT] [--rep MS]``.
    ``table(rep)`` gives (head, body), printing rows as it measures them; both go to --out.  2 without
    a CUDA device."""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])
    p.add_argument("--out", default=out)
    p.add_argument("--rep", type=int, default=rep, help="do_bench rep (ms)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    head, body = table(args.rep)
    with open(args.out, "w") as f:
        f.write("\n".join(head + body) + "\n")
    return 0


def graph_ms(fn, rep: int) -> float:
    """Median ms of a CUDA-graph replay of fn() (warmed up on the capture stream)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = fn()
    torch.cuda.current_stream().wait_stream(stream)
    try:
        return do_bench_ms(graph.replay, rep)
    finally:
        del out
        graph.reset()


def candidate_row(cells: str, fn, refs, moved_bytes: int, rep: int, bound: float) -> str:
    """A table probe's row for one candidate, printed as it is measured: ``| cells | ok (error) | graph us |
    TB/s |`` (WRONG past ``bound``, the largest error relative to max |reference|), or the name of the
    exception it raised (a variant that fails to build is a row, not the end of the probe)."""
    try:
        err = max_rel_error(fn(), refs)
        ms = graph_ms(fn, rep)
    except Exception as e:  # noqa: BLE001
        line = f"| {cells} | {type(e).__name__} | - | - |"
    else:
        ok = f"ok ({err:.1e})" if err <= bound else f"WRONG ({err:.1e})"
        line = f"| {cells} | {ok} | {ms * 1e3:.1f} | {moved_bytes / ms / 1e9:.3f} |"
    print(line, flush=True)
    return line


def max_rel_error(outs, refs) -> float:
    worst = 0.0
    for o, r in zip(outs, refs, strict=True):
        scale = r.abs().max().item() or 1.0
        err = (o.double() - r).abs().max().item() / scale
        worst = max(worst, err if math.isfinite(err) else math.inf)
    return worst


class Case:
    def __init__(self, shape, dtype, backward: bool):
        g = torch.Generator(device="cuda").manual_seed(0)
        self.shape, self.dtype, self.backward = shape, dtype, backward
        self.x = torch.randn(shape, device="cuda", generator=g).to(dtype)
        c = shape[1]
        self.w = 1 + 0.1 * torch.randn(c, device="cuda", generator=g)
        self.b = 0.1 * torch.randn(c, device="cuda", generator=g)
        self.dy = torch.randn(shape, device="cuda", generator=g).to(dtype)
        x64 = self.x.double().requires_grad_(backward)
        w64 = self.w.double().requires_grad_(backward)
        b64 = self.b.double().requires_grad_(backward)
        y64 = F.group_norm(x64, GROUPS, w64, b64, EPS)
        self.ref = torch.autograd.grad(y64, (x64, w64, b64), self.dy.double()) if backward else (y64.detach(),)
        n, hw = shape[0], math.prod(shape[2:])
        e = self.x.element_size()
        self.bytes = (3 if backward else 2) * (n * c * hw * e + c * 4)

    def problem(self):
        from csrc_free_ops.group_norm.plan import Problem

        n, c = self.shape[:2]
        return Problem(n, c, math.prod(self.shape[2:]), GROUPS, self.x.element_size(), True, True, self.backward)

    def run_plan(self, p):
        from csrc_free_ops.group_norm import launch

        if self.backward:
            return lambda: launch.backward(self.dy, self.x, GROUPS, self.w, self.b, EPS, p)
        return lambda: (launch.forward(self.x, GROUPS, self.w, self.b, EPS, p),)

    def run_op(self, fn, params_in_x_dtype: bool = False):
        """fn(x, G, w, b, eps) through autograd: forward, or backward of a recorded forward.
        params_in_x_dtype: weight and bias in x's dtype, for torch's own group_norm, which on
        CUDA (torch 2.11) refuses float32 parameters beside bfloat16 activations."""
        w, b = (self.w.to(self.x.dtype), self.b.to(self.x.dtype)) if params_in_x_dtype else (self.w, self.b)
        if not self.backward:
            return lambda: (fn(self.x, GROUPS, w, b, EPS),)
        leaves = [t.detach().requires_grad_() for t in (self.x, w, b)]
        y = fn(leaves[0], GROUPS, leaves[1], leaves[2], EPS)
        return lambda: torch.autograd.grad(y, leaves, self.dy, retain_graph=True)


def describe(p, case) -> str:
    """The path, and for one-pass plans tile / warps / prefetch / teams kept resident (after a first call)."""
    from csrc_free_ops.group_norm import launch

    if p.path != "one_pass":
        return p.path
    c, o = dict(p.steps[0].constexprs), dict(p.steps[0].options)
    capped = launch.capped_steps(p)
    if capped and capped[0] is None:
        teams = f"->{p.fallback.path}"
    elif capped:
        teams = f"teams {capped[0][0][1] // p.team_size}/{p.counters}"
    else:
        teams = "?"
    pf = "pf" if c["PREFETCH"] else "nopf"
    return f"1p [{c['BLOCK_C']}x{c['BLOCK_HW']}] w{o.get('num_warps')} {pf} team {p.team_size} {teams}"


def candidates(case, quick: bool):
    from csrc_free_ops.group_norm import launch, plan

    pb = case.problem()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    dev = launch._cuda_device(case.x.device, sms)
    shipped = plan.cuda(pb, dev)
    out = [("plan", shipped)]
    fallback = shipped.fallback or plan.cuda_two_walk(pb, sms)
    out += [("looped", plan.cuda_looped(pb, sms)), ("split", plan.cuda_split(pb, sms))]
    if not quick:
        for tile, warps in ONE_PASS_SWEEP[pb.backward]:
            for prefetch in (False, True):
                p = plan.cuda_one_pass(pb, sms, tile, warps, prefetch, fallback, max_rounds=1 << 30)
                out.append((f"1p/{tile}/w{warps}/{'pf' if prefetch else 'nopf'}", p))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--shapes", default=",".join(str(i) for i in range(len(SHAPES))))
    ap.add_argument("--rep", type=int, default=40, help="do_bench rep ms")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    import torch._functorch.config as functorch_config  # not imported by `import torch` on torch 2.11
    import triton

    import registrations  # noqa: F401

    functorch_config.donated_buffer = False  # backward-only timing of compile retains the graph
    torch._dynamo.config.cache_size_limit = 256  # one compile per shape, dtype and grad mode
    torch._dynamo.config.accumulated_cache_size_limit = 1024
    compiled = torch.compile(F.group_norm, dynamic=False)
    props = torch.cuda.get_device_properties(0)
    print(f"# {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}")
    print("shape dtype dir | candidate | what | ok (max rel err) | graph us | TB/s | eager us")
    t_start = time.time()
    summary = []
    for i in (int(s) for s in args.shapes.split(",")):
        shape = SHAPES[i]
        for dtype in (torch.bfloat16, torch.float32):
            for backward in (False, True):
                case = Case(shape, dtype, backward)
                tag = f"{tuple(shape)} {str(dtype)[6:]} {'bwd' if backward else 'fwd'}"
                rows = []
                runs = [(n, p, case.run_plan(p)) for n, p in candidates(case, args.quick)]
                runs.append(("op", None, case.run_op(torch.ops.liger.group_norm)))
                runs.append(("torch", None, case.run_op(F.group_norm, params_in_x_dtype=True)))
                if not args.no_compile:
                    runs.append(("compile", None, case.run_op(compiled, params_in_x_dtype=True)))
                for name, p, fn in runs:
                    try:
                        err = max_rel_error(fn(), case.ref)
                        torch.cuda.synchronize()
                        g = graph_ms(fn, args.rep) * 1e3
                        e = do_bench_ms(fn, args.rep) * 1e3
                    except Exception as ex:  # a candidate that fails to run is reported, not fatal
                        print(f"{tag} | {name} | FAILED {type(ex).__name__}: {str(ex)[:200]}", flush=True)
                        continue
                    ok = "ok" if err <= TOLERANCE[dtype] else "BAD"
                    what = describe(p, case) if p is not None else ""
                    rows.append((name, g, e, ok))
                    tbs = case.bytes / g / 1e6
                    print(f"{tag} | {name} | {what} | {ok} ({err:.1e}) | {g:.1f} | {tbs:.2f} | {e:.1f}", flush=True)
                summary.append((tag, rows))
                del case
                torch.cuda.empty_cache()
    print(f"\n# summary (graph us; best candidate of ours vs torch eager / compile), {time.time() - t_start:.0f} s")
    for tag, rows in summary:
        ours = [r for r in rows if r[0] not in ("op", "torch", "compile") and r[3] == "ok"]
        rivals = {r[0]: r[1] for r in rows if r[0] in ("torch", "compile")}
        if not ours:
            print(f"{tag}: no candidate ran")
            continue
        best = min(ours, key=lambda r: r[1])
        shipped = next((r for r in ours if r[0] == "plan"), None)
        rival = " ".join(f"{k} {v:.1f}" for k, v in rivals.items())
        plan_us = f"{shipped[1]:.1f}" if shipped else "-"
        print(f"{tag}: plan {plan_us}, best {best[0]} {best[1]:.1f} | {rival}")
    print(
        "\n# reading the table (csrc_free_ops/group_norm/plan.py):\n"
        "#  * one-pass vs looped/split per row: if a 1p/... row beats 'plan', set ONE_PASS_TILES[backward] to put\n"
        "#    that tile first, ONE_PASS_WARPS to its warps, ONE_PASS_PREFETCH to whether pf won;\n"
        "#  * where looped/split beat every 1p row, lower ONE_PASS_MAX_ROUNDS below that row's rounds\n"
        "#    (the 'teams k/rows' column: rounds = ceil(rows / k));\n"
        "#  * 'plan' should equal the best of its own path: if it is slower than the same-path row, the planner\n"
        "#    chose another tile (ONE_PASS_FILL, estimated_registers' ONE_PASS_BASE_REGS);\n"
        "#  * looped vs split at small N: FWD/BWD_LOOP_ROWS_PER_SM (v5's thresholds) pick between them."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
