"""group_norm on channels-last x: the nhwc plan's variants side by side with
today's channels-last path, the same shape contiguous, torch eager and
torch.compile, at the diffusion shapes (bench/shapes.py), SiLU fused, 32
groups; every candidate checked against float64 first.

    python -m bench.lab.probe_group_norm_nhwc                       # bf16, fwd and bwd, every variant
    python -m bench.lab.probe_group_norm_nhwc --dtypes bf16,fp32 --out /tmp/nhwc.md
    python -m bench.lab.probe_group_norm_nhwc --quick --no-compile  # three variants a row

Times are do_bench medians of a CUDA-graph replay (GPU time, the
harness's ``graph`` timer); ``eager`` (host cost included) is added for the
shipped plan and the op.  Candidates:

* ``nhwc/C<tile_c>/T<tile>/I<items>``: plan.cuda_nhwc with tiles of at most
  tile_c channels and tile elements, items_per_sm work items per SM;
* ``today``: what plan.cuda gives channels-last x with the nhwc path off;
* ``plan``: what plan.cuda ships; ``op``: torch.ops.liger.group_norm
  through autograd;
* ``team/C<tile_c>/T<tile>``: plan.cuda_nhwc_team (teams of whole groups
  over two launches, the partials merged by apply / dx itself);
* ``one_pass/C<tile_c>/T<tile>/W<warps>``: plan.cuda_nhwc_one_pass (the
  same teams in one cooperative launch, x read once; path ``fallback``
  where its compiled kernel's teams were not resident and today's nhwc
  plan ran instead);
* ``contiguous``: plan.cuda's plan for the same x contiguous (the layout gap);
* ``torch`` / ``compile``: silu(F.group_norm(x)) eager and under torch.compile.

The table is printed and written to --out (markdown).  Its last lines say
which plan constants to set from it.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from bench.lab.probe_group_norm import do_bench_ms, graph_ms, max_rel_error

SHAPES = [(2, 320, 64, 64), (8, 640, 32, 32), (16, 1280, 16, 16), (4, 512, 128, 128), (1, 128, 512, 512)]
GROUPS = 32
EPS = 1e-5
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
TOLERANCE = {torch.bfloat16: 3e-2, torch.float32: 1e-4}
TILE_C = (64, 128, 256, 512)
TILE = (2048, 4096, 8192)
ITEMS_PER_SM = (2, 4, 8)
QUICK = ((128, 4096, 4), (256, 4096, 4), (256, 8192, 8))
# Team candidates: (tile_c, tile) and one-pass warps.
TEAM_TILES = ((64, 1024), (64, 2048), (64, 4096), (128, 2048), (128, 4096))
TEAM_WARPS = (4, 8)


def silu_group_norm(x, num_groups, weight, bias, eps):
    return F.silu(F.group_norm(x, num_groups, weight, bias, eps))


class Case:
    """One (shape, dtype, direction), x channels-last, and its float64 reference."""

    def __init__(self, shape, dtype, backward: bool):
        g = torch.Generator(device="cuda").manual_seed(0)
        self.shape, self.dtype, self.backward = shape, dtype, backward
        self.x = torch.randn(shape, device="cuda", generator=g).to(dtype).contiguous(memory_format=torch.channels_last)
        c = shape[1]
        self.w = 1 + 0.1 * torch.randn(c, device="cuda", generator=g)
        self.b = 0.1 * torch.randn(c, device="cuda", generator=g)
        self.dy = torch.randn(shape, device="cuda", generator=g).to(dtype).contiguous(memory_format=torch.channels_last)
        leaves = [t.double().requires_grad_(backward) for t in (self.x, self.w, self.b)]
        y64 = silu_group_norm(leaves[0], GROUPS, leaves[1], leaves[2], EPS)
        self.ref = torch.autograd.grad(y64, leaves, self.dy.double()) if backward else (y64.detach(),)
        self.bytes = (3 if backward else 2) * (self.x.numel() * self.x.element_size() + c * 4)

    def problem(self, channels_last: bool = True):
        from csrc_free_ops.group_norm.plan import Problem

        n, c = self.shape[:2]
        return Problem(n, c, math.prod(self.shape[2:]), GROUPS, self.x.element_size(), True, True, self.backward,
                       "silu", channels_last)  # fmt: skip

    def run_plan(self, p, x=None):
        from csrc_free_ops.group_norm import launch

        x = self.x if x is None else x
        dy = self.dy if x is self.x else self.dy.contiguous()
        if self.backward:
            return lambda: launch.backward(dy, x, GROUPS, self.w, self.b, EPS, p)
        return lambda: (launch.forward(x, GROUPS, self.w, self.b, EPS, p),)

    def run_op(self, fn, params_in_x_dtype: bool = False):
        w, b = (self.w.to(self.dtype), self.b.to(self.dtype)) if params_in_x_dtype else (self.w, self.b)
        if not self.backward:
            return lambda: (fn(self.x, GROUPS, w, b, EPS),)
        leaves = [t.detach().requires_grad_() for t in (self.x, w, b)]
        y = fn(leaves[0], GROUPS, leaves[1], leaves[2], EPS)
        return lambda: torch.autograd.grad(y, leaves, self.dy, retain_graph=True)


@contextlib.contextmanager
def nhwc_off():
    from csrc_free_ops.group_norm import plan

    kept = plan.NHWC_MAX_GROUP_ROW_BYTES
    plan.NHWC_MAX_GROUP_ROW_BYTES = 0
    try:
        yield
    finally:
        plan.NHWC_MAX_GROUP_ROW_BYTES = kept


def candidates(case, quick: bool, dev):
    from csrc_free_ops.group_norm import plan

    out = [("plan", plan.cuda(case.problem(), dev), None)]
    with nhwc_off():
        out.append(("today", plan.cuda(case.problem(), dev), None))
    contiguous = case.x.contiguous()
    out.append(("contiguous", plan.cuda(case.problem(channels_last=False), dev), contiguous))
    for tile_c, tile, items in QUICK if quick else itertools.product(TILE_C, TILE, ITEMS_PER_SM):
        if tile_c > tile:
            continue
        p = plan.cuda_nhwc(case.problem(), dev.sms, tile_c, tile // (2 if case.backward else 1), items)
        out.append((f"nhwc/C{tile_c}/T{tile}/I{items}", p, None))
    for tile_c, tile in TEAM_TILES[:2] if quick else TEAM_TILES:
        team = plan.cuda_nhwc_team(case.problem(), dev.sms, tile_c, tile)
        if team is not None:
            out.append((f"team/C{tile_c}/T{tile}", team, None))
        for warps in TEAM_WARPS:
            one = plan.cuda_nhwc_one_pass(case.problem(), dev, out[0][1], tile_c, tile, warps)
            if one is not None:
                out.append((f"one_pass/C{tile_c}/T{tile}/W{warps}", one, None))
    return out


def _path(p) -> str:
    """p's path, ``fallback`` for a one-pass plan whose teams were not resident (its fallback ran)."""
    from csrc_free_ops.group_norm import launch

    return "fallback" if p.team_size and None in launch.capped_steps(p) else p.path


def _op(x, num_groups, weight, bias, eps):
    return torch.ops.liger.group_norm(x, num_groups, weight, bias, eps, activation="silu")


def measure(case, args, compiled, dev):
    """(name, path, graph us, eager us or None, ok, err) of every candidate of case."""
    runs = [(n, p, case.run_plan(p, x), n == "plan") for n, p, x in candidates(case, args.quick, dev)]
    runs.append(("op", None, case.run_op(_op), True))
    runs.append(("torch", None, case.run_op(silu_group_norm, params_in_x_dtype=True), False))
    if not args.no_compile:
        runs.append(("compile", None, case.run_op(compiled, params_in_x_dtype=True), False))
    rows = []
    for name, p, fn, eager in runs:
        path = "" if p is None else p.path
        try:
            err = max_rel_error(fn(), case.ref)
            path = "" if p is None else _path(p)
            torch.cuda.synchronize()
            g = graph_ms(fn, args.rep) * 1e3
            e = do_bench_ms(fn, args.rep) * 1e3 if eager else None
        except Exception as ex:  # a candidate that fails to run is reported, not fatal
            rows.append((name, path, math.nan, None, f"FAILED {type(ex).__name__}: {str(ex)[:120]}", math.inf))
            continue
        rows.append((name, path, g, e, "ok" if err <= TOLERANCE[case.dtype] else "BAD", err))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.lab.probe_group_norm_nhwc")
    ap.add_argument("--quick", action="store_true", help=f"only the variants {QUICK}")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--dtypes", default="bf16", help="comma list of bf16, fp32")
    ap.add_argument("--shapes", default=",".join(str(i) for i in range(len(SHAPES))), help="indices into SHAPES")
    ap.add_argument("--rep", type=int, default=40, help="do_bench rep ms")
    ap.add_argument("--out", default="probe_group_norm_nhwc.md", help="markdown table written here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    import torch._functorch.config as functorch_config
    import triton

    import registrations  # noqa: F401
    from csrc_free_ops.group_norm import launch

    functorch_config.donated_buffer = False  # backward-only timing of compile retains the graph
    torch._dynamo.config.cache_size_limit = 256
    torch._dynamo.config.accumulated_cache_size_limit = 1024
    compiled = torch.compile(silu_group_norm, dynamic=False)
    props = torch.cuda.get_device_properties(0)
    dev = launch._cuda_device(torch.device("cuda", 0), props.multi_processor_count)
    lines = [f"# group_norm + SiLU, channels-last x: {props.name}, {props.multi_processor_count} SMs, "
             f"torch {torch.__version__}, triton {triton.__version__}", "",
             "| shape | dtype | dir | candidate | path | ok (max rel err) | graph us | TB/s | eager us |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    print("\n".join(lines), flush=True)
    start, summary = time.time(), []
    for i, dname, backward in itertools.product(
        (int(s) for s in args.shapes.split(",")), args.dtypes.split(","), (False, True)
    ):
        case = Case(SHAPES[i], DTYPES[dname], backward)
        tag = (f"{SHAPES[i]}", dname, "bwd" if backward else "fwd")
        rows = measure(case, args, compiled, dev)
        for name, path, g, e, ok, err in rows:
            eager = "" if e is None else f"{e:.1f}"
            tbs = case.bytes / g / 1e6 if g == g else math.nan
            line = f"| {' | '.join(tag)} | {name} | {path} | {ok} ({err:.1e}) | {g:.1f} | {tbs:.2f} | {eager} |"
            lines.append(line)
            print(line, flush=True)
        summary.append((tag, rows))
        del case
        torch.cuda.empty_cache()
    lines += ["", f"## Summary (graph us), {time.time() - start:.0f} s", ""]
    lines += ["| shape | dtype | dir | best nhwc | best team | plan | today | contiguous | compile | torch | "
              "plan/contiguous | best team/contiguous |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    slowdowns: dict[tuple[str, str], list[float]] = {}  # (direction, variant): time / the row's best
    for tag, rows in summary:
        t = {r[0]: r[2] for r in rows if r[4] == "ok"}
        variants = {k: v for k, v in t.items() if k.startswith("nhwc/")}
        if not variants:
            lines.append(f"| {' | '.join(tag)} | no nhwc variant ran |")
            continue
        best = min(variants, key=variants.get)
        for k, v in variants.items():
            slowdowns.setdefault((tag[2], k), []).append(v / variants[best])
        teams = {r[0]: r[2] for r in rows if r[4] == "ok" and r[1] in ("nhwc_team", "nhwc_one_pass")}
        best_team = min(teams, key=teams.get) if teams else None
        team_cell = f"{best_team} {teams[best_team]:.1f}" if best_team else "-"
        cells = [f"{t[k]:.1f}" if k in t else "-" for k in ("plan", "today", "contiguous", "compile", "torch")]
        gap = f"{t['plan'] / t['contiguous']:.2f}x" if "plan" in t and "contiguous" in t else "-"
        team_gap = f"{teams[best_team] / t['contiguous']:.2f}x" if best_team and "contiguous" in t else "-"
        lines.append(f"| {' | '.join(tag)} | {best} {variants[best]:.1f} | {team_cell} | {' | '.join(cells)} | {gap} "
                     f"| {team_gap} |")  # fmt: skip
    lines.append("")
    for direction in sorted({d for d, _ in slowdowns}):
        # geometric mean over the direction's rows of each variant's time over the row's best
        mean = {k: math.exp(statistics.fmean(map(math.log, r))) for (d, k), r in slowdowns.items() if d == direction}
        ranked = sorted(mean.items(), key=lambda kv: kv[1])[:6]
        lines.append(f"Variants by mean slowdown over the {direction} rows' best: "
                     + ", ".join(f"{k} {m:.2f}x" for k, m in ranked))  # fmt: skip
    lines.append("")
    lines += [
        "## Reading the table (csrc_free_ops/group_norm/plan.py)",
        "",
        "* NHWC_TILE_C / NHWC_TILE / NHWC_ITEMS_PER_SM: each direction's first variant on the lines above "
        "(fwd: key False, bwd: key True); NHWC_TILE[True] is half the backward rows' T (the probe halves it as "
        "the plan does).",
        "* NHWC_MAX_GROUP_ROW_BYTES / NHWC_MIN_BYTES: every row where 'today' beats 'plan' (channels-last) "
        "moves the boundary: raise NHWC_MIN_BYTES above that x's bytes, or lower the row-bytes bound below its "
        "cpg * element size.",
        "* Targets (issue 35): 'plan' below 'compile' and upstream on every row; plan/contiguous <= 1.10.",
        "* best team: where a team/ or one_pass/ variant beats 'plan' on a row, plan.cuda should take it there "
        "(plan.NHWC_TEAM_MERGE's comment).",
    ]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[len(lines) - len(summary) - 12 :]))
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
