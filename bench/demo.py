"""The project's main job: every op, forward and backward, on the best
device present, checked against the float64 reference and timed.

    python -m bench.demo        (nox -s demo)

CUDA when available (fp32 and bf16, modest training shapes), followed by a
short speed table against upstream Liger-Kernel and torch.compile (each when
installed); otherwise CPU with the Triton interpreter running the real
kernels (fp32, small shapes, well under a minute), where the speed table is
skipped: interpreter times say nothing about speed.  The ops are called
through the user-facing drop-ins in liger_nn (PolyNorm,
apply_rotary_pos_emb, GroupNorm), which sit on torch.ops.liger.*; the
float64 closed forms in csrc_free_ops.<op>.reference are the ground truth.
Exits 1 if any error is over its tolerance.
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # the imports below take seconds (tens on a first run, compiling bytecode)
    print("csrc-free-ops demo: importing torch, triton and the ops ...", flush=True)

import torch  # noqa: E402

if not torch.cuda.is_available():
    # Before any kernel module is imported: run the Triton kernels on CPU tensors.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import liger_nn  # noqa: E402
from csrc_free_ops.group_norm import reference as gn_ref  # noqa: E402
from csrc_free_ops.poly_norm import reference as pn_ref  # noqa: E402
from csrc_free_ops.rope import reference as rope_ref  # noqa: E402

# The largest "rel err" (max |ours - reference| / max |reference|) each dtype passes with: (forward, backward).
TOLERANCE = {
    torch.float32: (1e-4, 1e-3),
    torch.float16: (4e-3, 1e-2),
    torch.bfloat16: (3e-2, 5e-2),
}

CUDA_SHAPES = {
    "poly_norm": (4096, 4096),
    "rope": (2, 32, 8, 2048, 128),  # B, Hq, Hkv, T, D
    "group_norm": (8, 512, 4096, 32),  # N, C, L, groups
}
CPU_SHAPES = {
    "poly_norm": (8, 256),
    "rope": (1, 4, 2, 16, 32),
    "group_norm": (2, 16, 32, 4),
}


@dataclass
class Row:
    op: str
    device: str
    dtype: torch.dtype
    shape: str
    fwd_err: float
    bwd_err: float
    fwd_ms: float
    bwd_ms: float

    @property
    def ok(self) -> bool:
        fwd_tol, bwd_tol = TOLERANCE[self.dtype]
        return self.fwd_err <= fwd_tol and self.bwd_err <= bwd_tol


def max_rel_error(outs: Sequence[torch.Tensor], refs: Sequence[torch.Tensor]) -> float:
    """Largest max|out - ref| / max|ref| over the pairs; inf if not finite."""
    worst = 0.0
    for o, r in zip(outs, refs, strict=True):
        o64, r64 = o.detach().double().cpu(), r.detach().double().cpu()
        scale = r64.abs().max().item() or 1.0
        err = (o64 - r64).abs().max().item() / scale
        if not err == err or err == float("inf"):
            return float("inf")
        worst = max(worst, err)
    return worst


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_ms(fn: Callable[[], object], device: str, reps: int) -> float:
    """Median wall-clock ms of fn() over reps calls, after one warm-up call on
    CUDA (on CPU the call before the timing warmed up the interpreter)."""
    if device == "cuda":
        fn()
        _sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _fwd_bwd(fn, inputs, device, reps):
    """(outputs, grads, forward ms, backward ms) of fn(*inputs) against a fixed random output grad."""
    outs = fn()
    outs = outs if isinstance(outs, tuple) else (outs,)
    gen = torch.Generator(device=device).manual_seed(7)
    dys = tuple(torch.randn(o.shape, device=device, generator=gen).to(o.dtype) for o in outs)
    grads = torch.autograd.grad(outs, inputs, dys, retain_graph=True)
    fwd_ms = time_ms(fn, device, reps)
    bwd_ms = time_ms(lambda: torch.autograd.grad(outs, inputs, dys, retain_graph=True), device, reps)
    return outs, grads, dys, fwd_ms, bwd_ms


def demo_poly_norm(device: str, dtype: torch.dtype, reps: int) -> Row:
    m, h = (CUDA_SHAPES if device == "cuda" else CPU_SHAPES)["poly_norm"]
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m, h, device=device, generator=gen).to(dtype).requires_grad_(True)
    layer = liger_nn.PolyNorm().to(device=device, dtype=dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([0.5, 0.3, 0.2]))
        layer.bias.fill_(0.1)
    params = (x, layer.weight, layer.bias)
    outs, grads, dys, fwd_ms, bwd_ms = _fwd_bwd(lambda: layer(x), params, device, reps)
    x64, w64, b64 = (t.detach().double() for t in params)
    y_ref = pn_ref.forward(x64, w64, b64, layer.eps)
    g_ref = pn_ref.backward(dys[0].double(), x64, w64, layer.eps)
    bwd = max_rel_error(grads, (g_ref[0], g_ref[1], g_ref[2].reshape(layer.bias.shape)))
    return Row("poly_norm", device, dtype, f"x ({m}, {h})", max_rel_error(outs, (y_ref,)), bwd, fwd_ms, bwd_ms)


def demo_rope(device: str, dtype: torch.dtype, reps: int) -> Row:
    b, hq, hkv, t, d = (CUDA_SHAPES if device == "cuda" else CPU_SHAPES)["rope"]
    gen = torch.Generator(device=device).manual_seed(0)
    # HF's layout: (B, T, H, D) storage seen as (B, H, T, D).
    q = torch.randn(b, t, hq, d, device=device, generator=gen).to(dtype).transpose(1, 2).requires_grad_(True)
    k = torch.randn(b, t, hkv, d, device=device, generator=gen).to(dtype).transpose(1, 2).requires_grad_(True)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=device, dtype=torch.float64) / d))
    emb = torch.outer(torch.arange(t, device=device, dtype=torch.float64), inv_freq)
    emb = torch.cat((emb, emb), dim=-1)[None]
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    outs, grads, dys, fwd_ms, bwd_ms = _fwd_bwd(
        lambda: liger_nn.apply_rotary_pos_emb(q, k, cos, sin), (q, k), device, reps
    )
    q64, k64, c64, s64 = (t_.detach().double() for t_ in (q, k, cos, sin))
    y_ref = rope_ref.forward(q64, k64, c64, s64)
    g_ref = rope_ref.backward(dys[0].double(), dys[1].double(), c64, s64)
    shape = f"q ({b}, {hq}, {t}, {d}), k ({b}, {hkv}, {t}, {d})"
    return Row("rope", device, dtype, shape, max_rel_error(outs, y_ref), max_rel_error(grads, g_ref), fwd_ms, bwd_ms)


def demo_group_norm(device: str, dtype: torch.dtype, reps: int) -> Row:
    n, c, length, groups = (CUDA_SHAPES if device == "cuda" else CPU_SHAPES)["group_norm"]
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n, c, length, device=device, generator=gen).to(dtype).requires_grad_(True)
    layer = liger_nn.GroupNorm(groups, c, device=device, dtype=dtype)
    with torch.no_grad():
        layer.weight.copy_(1.0 + 0.1 * torch.randn(c, device=device, generator=gen))
        layer.bias.copy_(0.1 * torch.randn(c, device=device, generator=gen))
    params = (x, layer.weight, layer.bias)
    outs, grads, dys, fwd_ms, bwd_ms = _fwd_bwd(lambda: layer(x), params, device, reps)
    x64, w64, b64 = (t.detach().double() for t in params)
    y_ref = gn_ref.forward(x64, groups, w64, b64, layer.eps)
    g_ref = gn_ref.backward(dys[0].double(), x64, groups, w64, b64, layer.eps)
    shape = f"x ({n}, {c}, {length}), {groups} groups"
    return Row(
        "group_norm", device, dtype, shape, max_rel_error(outs, (y_ref,)), max_rel_error(grads, g_ref), fwd_ms, bwd_ms
    )


DEMOS = (demo_poly_norm, demo_rope, demo_group_norm)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def format_table(rows: Sequence[Row]) -> str:
    head = ["op", "device", "dtype", "shape", "rel err fwd", "rel err bwd", "tol fwd / bwd", "fwd ms", "bwd ms", "ok"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        fwd_tol, bwd_tol = TOLERANCE[r.dtype]
        cells = [r.op, r.device, _dtype_name(r.dtype), r.shape, f"{r.fwd_err:.2e}", f"{r.bwd_err:.2e}"]
        cells += [f"{fwd_tol:.0e} / {bwd_tol:.0e}", f"{r.fwd_ms:.3f}", f"{r.bwd_ms:.3f}"]
        cells.append("ok" if r.ok else "OVER TOLERANCE")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def legend(device: str) -> str:
    """What the columns of format_table mean."""
    lines = [
        "Columns:",
        "  rel err fwd / bwd  max |ours - reference| / max |reference|, the worst over the outputs (fwd) or",
        "                     the gradients (bwd); reference: the float64 closed form on the same inputs",
        "  tol fwd / bwd      the largest rel err the dtype passes with",
        "  fwd ms / bwd ms    median wall-clock ms of one forward call / of the backward of one kept graph",
        "  ok                 both errors within tolerance",
    ]
    if device == "cpu":
        lines.insert(5, "                     (on the CPU: interpreter times, which say nothing about speed)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Speed against the rivals (CUDA only)

RIVALS = {"liger_kernel": "Liger-Kernel", "compile": "torch.compile"}
COMPARE_DTYPE = "bfloat16"


def compare_shapes() -> dict[str, dict]:
    """The CUDA demo shapes, in bench.providers' terms."""
    m, h = CUDA_SHAPES["poly_norm"]
    b, hq, hkv, t, d = CUDA_SHAPES["rope"]
    n, c, length, groups = CUDA_SHAPES["group_norm"]
    return {
        "poly_norm": {"M": m, "H": h, "dtype": COMPARE_DTYPE},
        "rope": {"B": b, "T": t, "n_q_heads": hq, "n_kv_heads": hkv, "head_dim": d, "dtype": COMPARE_DTYPE},
        "group_norm": {"M": n, "C": c, "H": length, "num_groups": groups, "dtype": COMPARE_DTYPE},
    }


def gpu_ms(fn: Callable[[], object]) -> float:
    """Median ms of fn() by triton.testing.do_bench (L2 flushed before each call)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def compare(device: str, timer: Callable[[Callable[[], object]], float] = gpu_ms) -> dict[str, dict[str, object]]:
    """op -> provider -> forward+backward ms, or the reason a rival did not run.
    Providers: this project ("liger") and RIVALS, through bench.providers."""
    from bench import providers

    results: dict[str, dict[str, object]] = {}
    for op, shape in compare_shapes().items():
        results[op] = {}
        for provider in ("liger", *RIVALS):
            try:
                built = providers.build(op, provider, shape, device)
                built.prepare()
                results[op][provider] = timer(built.full_timer())
            except Exception as e:  # a rival not installed (ProviderUnavailable) or failing here
                if provider == "liger":
                    raise
                reason = str(e) if isinstance(e, providers.ProviderUnavailable) else repr(e)
                results[op][provider] = reason.split("\n")[0]
    return results


def format_comparison(results: dict[str, dict[str, object]], upstream: str | None) -> str:
    """The speed table, then why each rival that did not run did not."""
    names = {**RIVALS, "liger_kernel": f"Liger-Kernel {upstream}" if upstream else "Liger-Kernel"}
    head = ["op", "ours ms"]
    for provider in RIVALS:
        head += [f"{names[provider]} ms", "x"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    reasons: dict[str, str] = {}
    for op, times in results.items():
        ours = times["liger"]
        cells = [op, f"{ours:.3f}"]
        for provider in RIVALS:
            t = times[provider]
            if isinstance(t, float):
                cells += [f"{t:.3f}", f"{t / ours:.2f}"]
            else:
                cells += ["not run", "-"]
                reasons.setdefault(f"{names[provider]} not run: {t}", op)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + list(reasons))


def comparison_report(device: str) -> str:
    """The speed table on CUDA; on the CPU, why there is none."""
    if device != "cuda":
        return (
            "Speed against upstream Liger-Kernel and torch.compile: skipped on the CPU. The interpreter runs the "
            "kernels in Python, so its times say nothing about speed; on a CUDA GPU the demo prints that table."
        )
    from bench import providers

    title = (
        f"Speed, {COMPARE_DTYPE} forward+backward at the shapes above (median ms, triton.testing.do_bench of the "
        'eager calls, L2 flushed); "x" = the rival\'s time / ours, above 1 means ours is faster. Missing rivals: '
        "pip install liger-kernel (the compare extra); torch.compile comes with torch."
    )
    return title + "\n" + format_comparison(compare(device), providers.upstream_version())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-compare", action="store_true", help="skip the CUDA speed table against the rivals")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtypes = (torch.float32, torch.bfloat16) if device == "cuda" else (torch.float32,)
    reps = 20 if device == "cuda" else 1
    if device == "cuda":
        where = f"{torch.cuda.get_device_name()}, the compiled Triton kernels"
    elif os.environ.get("TRITON_INTERPRET") == "1":
        where = "the CPU, the Triton kernels under the Triton interpreter (TRITON_INTERPRET=1)"
    else:
        where = "the CPU, the pure-PyTorch reference (TRITON_INTERPRET was not set before import)"
    print(f"csrc-free-ops demo on {where}; torch {torch.__version__}, triton {_triton_version()}")
    print("Each op forward and backward through liger_nn, checked against its float64 reference ...", flush=True)
    rows = []
    for dtype in dtypes:
        for demo in DEMOS:
            rows.append(demo(device, dtype, reps))
    print(format_table(rows))
    print(legend(device))
    bad = [r for r in rows if not r.ok]
    if bad:
        print(f"FAILED: {len(bad)} case(s) over tolerance: " + ", ".join(f"{r.op} {_dtype_name(r.dtype)}" for r in bad))
        return 1
    print("All ops within tolerance of the float64 reference.")
    if not args.no_compare:
        print()
        if device == "cuda":
            print("Timing ours against the rivals (torch.compile compiles each reference first) ...", flush=True)
        print(comparison_report(device), flush=True)
    return 0


def _triton_version() -> str:
    import triton

    return triton.__version__


if __name__ == "__main__":
    sys.exit(main())
