"""Phase 2 of the Ascend compile check: compile every recorded NPU launch with
triton-ascend and bishengir, without an NPU or CANN.

Runs in a venv of its own with triton-ascend (installed as ``triton``),
pybind11 and ascendnpu-ir (``nox -s npu_compile`` makes it and runs both
phases).  For each spec that ``tests/npu_launch_specs.py`` wrote, it builds
the ``ASTSource`` triton-ascend's JIT would (argument types, constexprs,
16-divisibility and equal-to-1 specialization) and runs the backend's own
stages: ``ttir``, ``ttadapter`` (Linalg/HIVM MLIR) and ``npubin``, which
calls ``bishengir-compile`` through HFusion and HIVM, UB allocation
included.  Two things of the backend are replaced, since they need CANN:
the chip name comes from the spec's profile instead of the driver, and
bishengir's temporaries are kept to read the UB plan.  Without CANN's
``hivmc`` a good compile ends with "returning module before running external
compiler"; anything else is a failure.

UB figures.  A compile that fits reports the high-water mark of the UB
buffers in its final HIVM module; one that does not reports bishengir's
"ub overflow, requires N bits".  bishengir retries an overflowing kernel
without multi-buffering and code motion; a planned tile that compiles only
that way counts as overflowing (the cost model budgets for double buffering).

Verdicts:
* every planned launch (role "model") compiles and fits the UB with
  multi-buffering, else the check fails naming kernel, plan and message;
* every next power-of-two tile (role "next": the same run with the UB
  doubled, where it launches a spec the run did not) is reported as
  overflowing, as the tight model expects, or as fitting (the model is
  conservative there), with both UB figures.

    python -m tests.npu_compile_check SPECS.json [--report OUT.json] [--jobs N]
"""

from __future__ import annotations

import argparse
import collections
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import types
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import triton
import triton.language as tl

PASS_MARK = "returning module before running external compiler"
OVERFLOW = re.compile(r"ub overflow, requires (\d+) bits while (\d+) bits available")
RETRIED = "Ub overflow detected"
# hivm.hir.pointer_cast(%c32768_i64[, %c...]) : memref<8x1024xbf16, #hivm.address_space<ub>>
UB_BUFFER = re.compile(
    r"hivm\.hir\.pointer_cast\(([^)]*)\)\s*:\s*memref<((?:\d+x)*)([a-z]+\d+)\b[^\n#]*#hivm\.address_space<ub>>"
)
ELEMENT_BITS = {"f64": 64, "i64": 64, "f32": 32, "i32": 32, "f16": 16, "bf16": 16, "i16": 16, "i8": 8, "i1": 8}


def _ascend_backend():
    """triton-ascend's compiler class and its module's globals (the backend
    registry loads it under a private module name)."""
    from triton.backends import backends

    if "ascend" not in backends:
        raise SystemExit("this Triton has no Ascend backend: run in the venv with triton-ascend (nox -s npu_compile)")
    cls = backends["ascend"].compiler
    return cls, cls.add_stages.__globals__


# triton-ascend 3.2's triton-adapter-opt (the Triton IR -> linalg stage) dies by SIGSEGV or SIGABRT on
# a few percent of its runs, on the same input file, with MLIR's threading on or off: such a death is
# that tool's, not a verdict on the kernel, so the stage runs again, up to this many times in all, and
# the report counts every death.  An exit with an error code is a verdict and is never rerun.
ADAPTER_ATTEMPTS = 4


def _run_adapter(cmd, state: dict, *args, **kwargs):
    check = kwargs.pop("check", False)
    for _ in range(ADAPTER_ATTEMPTS):
        done = subprocess.run(cmd, *args, **kwargs)
        if done.returncode >= 0:
            break
        state["adapter_deaths"] = state.get("adapter_deaths", 0) + 1
    if check and done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr)
    return done


def _patch_backend(state: dict) -> None:
    """Point the backend's npubin stage at the chip in ``state["chip"]`` and
    keep bishengir's temporaries in ``state["temps"]``; rerun triton-adapter-opt
    where it dies by a signal (ADAPTER_ATTEMPTS); everything else (the flags
    it passes, the metadata it parses) is the backend's own."""
    _, g = _ascend_backend()

    class _Utils:
        def get_arch(self) -> str:
            return state["chip"]

    def run(cmd, *args, **kwargs):
        if cmd and str(cmd[0]).endswith("bishengir-compile"):
            cmd = [*cmd, f"--save-temps={state['temps']}"]
        if cmd and str(cmd[0]).endswith("triton-adapter-opt"):
            return _run_adapter(cmd, state, *args, **kwargs)
        return subprocess.run(cmd, *args, **kwargs)

    g["NPUUtils"] = _Utils
    g["subprocess"] = types.SimpleNamespace(run=run, check_call=subprocess.check_call, PIPE=subprocess.PIPE)


def _ub_high_water(hivm: str) -> int:
    """Bytes of UB the final HIVM module addresses: the end of its furthest buffer."""
    top = 0
    for offsets, dims, elem in UB_BUFFER.findall(hivm):
        n = 1
        for d in dims.split("x")[:-1]:
            n *= int(d)
        size = n * ELEMENT_BITS[elem] // 8
        for off in re.findall(r"%c(\d+)_i64", offsets):
            top = max(top, int(off) + size)
    return top


def _message(text: str) -> str:
    errors = [ln.strip() for ln in text.splitlines() if "error" in ln.lower()]
    return " | ".join(errors[:3])[:600] or text.strip()[-600:]


_STATE: dict = {}


@triton.jit
def ub_probe_kernel(X, Y, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs) * 2.0)


def _init_worker(cache: str) -> None:
    os.environ["TRITON_CACHE_DIR"] = cache
    os.environ["TRITON_ALWAYS_COMPILE"] = "1"
    _patch_backend(_STATE)


def compile_spec(spec: dict) -> dict:
    """{"status", "ub_bytes", "required_bytes", "available_bytes", "message", "seconds"} of one spec."""
    import triton
    from triton.backends.compiler import AttrsDescriptor, GPUTarget
    from triton.compiler import ASTSource

    t0 = time.time()
    kernel = getattr(importlib.import_module(spec["module"]), spec["kernel"])
    names = kernel.arg_names
    index = {n: i for i, n in enumerate(names)}
    attrs = AttrsDescriptor.from_dict(
        {
            "arg_properties": {
                "tt.divisibility": [index[n] for n in spec["divisible_16"]],
                "tt.equal_to": [index[n] for n in spec["equal_to_1"]],
            },
            "cls": "AscendAttrsDescriptor",
        }
    )
    constexprs = {n: tl.dtype(v["tl.dtype"]) if isinstance(v, dict) else v for n, v in spec["constexprs"].items()}
    constants = {**constexprs, **{n: 1 for n in spec["equal_to_1"]}}
    result = {"status": "", "ub_bytes": None, "required_bytes": None, "available_bytes": None, "message": ""}
    with tempfile.TemporaryDirectory() as temps:
        _STATE.update(chip=spec["chip"], temps=temps, adapter_deaths=0)
        try:
            triton.compile(ASTSource(kernel, dict(spec["signature"]), constants, attrs),
                           target=GPUTarget("npu", spec["chip"], 0))  # fmt: skip
            text, stage = "", "npubin"
            result["status"] = "error"
            result["message"] = "triton.compile finished: this is not a CANN-less bishengir (hivmc present?)"
        except Exception as e:  # noqa: BLE001  (any failure is a verdict to report)
            text = str(e)
            stage = "npubin" if "ConvertLinalgRToBinary" in text else "frontend"
        if not result["status"]:
            over = OVERFLOW.search(text)
            hivm = Path(temps, "module.hivm.opt.mlir")
            if stage == "npubin" and PASS_MARK in text:
                result["status"] = "fits-without-multibuffer" if RETRIED in text else "ok"
                result["ub_bytes"] = _ub_high_water(hivm.read_text()) if hivm.exists() else None
            elif over:
                result["status"] = "ub-overflow"
                result["required_bytes"], result["available_bytes"] = (int(g) // 8 for g in over.groups())
                result["message"] = over.group(0)
            else:
                result["status"] = "frontend-error" if stage == "frontend" else "error"
                result["message"] = _message(text)
    result["seconds"] = round(time.time() - t0, 2)
    result["adapter_deaths"] = _STATE["adapter_deaths"]
    return result


def _plan(launch: dict, spec: dict) -> str:
    consts = ", ".join(f"{k}={v}" for k, v in spec["constexprs"].items())
    tiny = " (tiny UB)" if launch["tiny_ub"] else ""
    return (f"{launch['entry']} shape={launch['shape']} {launch['dtype']} {launch['profile']}{tiny} "
            f"ub={launch['ub_bytes']} -> {spec['kernel']}[{launch['grid']}]({consts})")  # fmt: skip


PROBE_BLOCK = 1 << 20  # float32 elements: 4 MiB, more UB than any Ascend chip has


def _probe_spec(chip: str) -> dict:
    """A copy kernel of PROBE_BLOCK elements, which overflows every chip: its
    error states the UB bishengir allows that chip."""
    return {"module": __name__ if __name__ != "__main__" else "tests.npu_compile_check", "kernel": "ub_probe_kernel",
            "signature": {"X": "*fp32", "Y": "*fp32"}, "constexprs": {"BLOCK": PROBE_BLOCK},
            "divisible_16": ["X", "Y"], "equal_to_1": [], "chip": chip}  # fmt: skip


def compile_key(spec: dict, chip: str) -> str:
    fields = ("module", "kernel", "signature", "constexprs", "divisible_16", "equal_to_1")
    return json.dumps([chip, *(spec[f] for f in fields)], sort_keys=True)


def compile_all(specs: dict, jobs: int) -> tuple[dict, dict]:
    """({spec id: result}, {chip: UB bytes bishengir allows}).  Chips whose UB
    bishengir gives alike (all of the 910B family today) share one compile of
    a spec, for the first of them."""
    chips = sorted({s["chip"] for s in specs.values()})
    with tempfile.TemporaryDirectory() as cache, ProcessPoolExecutor(jobs, initializer=_init_worker,
                                                                      initargs=(cache,)) as pool:  # fmt: skip
        probes = list(pool.map(compile_spec, [_probe_spec(c) for c in chips]))
        chip_ub = {c: p["available_bytes"] for c, p in zip(chips, probes, strict=True)}
        if None in chip_ub.values():
            raise SystemExit(f"the UB probe did not overflow: {dict(zip(chips, probes, strict=True))}")
        stand_in = {c: min(d for d in chips if chip_ub[d] == chip_ub[c]) for c in chips}
        keys = {i: compile_key(s, stand_in[s["chip"]]) for i, s in specs.items()}
        todo = {}
        for i, k in keys.items():
            todo.setdefault(k, {**specs[i], "chip": stand_in[specs[i]["chip"]]})
        done = dict(zip(todo, pool.map(compile_spec, list(todo.values()), chunksize=4), strict=True))
    return {i: done[k] for i, k in keys.items()}, chip_ub


# dtype -> the message triton-ascend rejects its launches with: such launches
# must fail with it (the check says when one compiles, so the entry can go).
KNOWN_UNSUPPORTED = {"fp64": "[fp8, fp64] is unsupported on Ascend"}


def _run_key(la: dict) -> tuple:
    return la["entry"], json.dumps(la["shape"]), la["dtype"], la["profile"], la["tiny_ub"]


def verdicts(data: dict, results: dict) -> tuple[list[str], list[dict]]:
    """(failures, next-tile rows).  A failure is a planned launch whose spec
    did not compile and fit.  A next-tile row pairs a planned launch with the
    launch at the same position of the doubled-UB run, where that one has
    another spec of the same kernel (a larger tile); a doubled-UB run that
    launches other kernels (another plan branch) is not paired."""
    specs, launches = data["specs"], data["launches"]
    failures = set()
    runs = collections.defaultdict(lambda: {"model": [], "next": []})
    for la in launches:
        runs[_run_key(la)][la["role"]].append(la)
        res = results[la["spec"]]
        known = KNOWN_UNSUPPORTED.get(la["dtype"])
        if la["role"] != "model":
            continue
        if known is not None:
            if known not in res["message"]:
                failures.add(f"{res['status']}, not the known '{known}': {_plan(la, specs[la['spec']])}")
        elif res["status"] != "ok":
            failures.add(f"{res['status']}: {_plan(la, specs[la['spec']])}: {res['message'] or res['status']}")
    rows = []
    for (_entry, _shape, dtype, _profile, tiny), r in runs.items():
        model, nxt = r["model"], r["next"]
        if tiny or dtype in KNOWN_UNSUPPORTED:
            continue
        if [specs[m["spec"]]["kernel"] for m in model] == [specs[n["spec"]]["kernel"] for n in nxt]:
            pairs = [(m, n) for m, n in zip(model, nxt, strict=True)
                     if _elements(specs[n["spec"]]) > _elements(specs[m["spec"]])]  # fmt: skip
        else:  # another plan branch: its kernels that the planned run did not launch, unpaired
            ran = {specs[m["spec"]]["kernel"] for m in model}
            pairs = [(None, n) for n in nxt if specs[n["spec"]]["kernel"] not in ran]
        for m, n in pairs:
            rows.append({"planned": m, "next": n, "planned_result": m and results[m["spec"]],
                         "next_result": results[n["spec"]]})  # fmt: skip
    return sorted(failures), rows


def _elements(spec: dict) -> int:
    """Elements of the spec's tile: the product of its BLOCK_* constexprs."""
    n = 1
    for k, v in spec["constexprs"].items():
        n *= v if k.startswith("BLOCK") and isinstance(v, int) else 1
    return n


def _tile(spec: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in spec["constexprs"].items() if k.startswith("BLOCK"))


def next_tile_table(data: dict, rows: list[dict]) -> list[str]:
    """One line per distinct (kernel, x's type, planned tile, next tile)."""
    specs = data["specs"]
    lines = {}
    for row in rows:
        ns, nr, nl = specs[row["next"]["spec"]], row["next_result"], row["next"]
        nfig = nr["ub_bytes"] if nr["status"] in ("ok", "fits-without-multibuffer") else nr["required_bytes"]
        x_type = next(iter(ns["signature"].values()))
        if row["planned"] is None:
            planned = f"{'(another plan branch)':<34}        "
        else:
            planned = f"{_tile(specs[row['planned']['spec']]):<34} UB {row['planned_result']['ub_bytes']}"
        key = (ns["kernel"], x_type, planned.split(" UB")[0], _tile(ns))
        lines.setdefault(key, f"{ns['kernel']:<22} x={x_type:<6} {nl['dtype']:<9} {nl['profile']:<12} "
                              f"planned {planned}; next {_tile(ns):<34} {nr['status']} {nfig}")  # fmt: skip
    return [lines[k] for k in sorted(lines)]


def _put_bishengir_on_path() -> None:
    """ascendnpu-ir ships bishengir-compile in its package's bin/ folder, which
    pip does not put on PATH; the backend looks it up there."""
    spec = importlib.util.find_spec("ascendnpuir")
    if spec is not None and spec.origin:
        os.environ["PATH"] = f"{Path(spec.origin).parent / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs")
    ap.add_argument("--report", help="write every spec's result and the verdicts here (JSON)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    if shutil.which("bishengir-compile") is None:
        _put_bishengir_on_path()
    if shutil.which("bishengir-compile") is None:
        print("bishengir-compile is not on PATH and ascendnpu-ir is not installed", file=sys.stderr)
        return 2
    data = json.loads(Path(args.specs).read_text())
    t0 = time.time()
    results, chip_ub = compile_all(data["specs"], args.jobs)
    elapsed = time.time() - t0
    failures, rows = verdicts(data, results)
    planned = [la for la in data["launches"] if la["role"] == "model" and la["dtype"] not in KNOWN_UNSUPPORTED]
    unsupported = [la for la in data["launches"] if la["role"] == "model" and la["dtype"] in KNOWN_UNSUPPORTED]
    status = collections.Counter(results[la["spec"]]["status"] for la in planned)
    print(f"UB bishengir allows: {chip_ub}")
    print(f"compiled {len(data['specs'])} specs in {elapsed:.0f} s with {args.jobs} jobs; "
          f"planned launches by result: {dict(status)}")  # fmt: skip
    deaths = sum(r.get("adapter_deaths", 0) for r in {id(r): r for r in results.values()}.values())  # shared ones once
    print(f"triton-adapter-opt died by a signal {deaths} times, each rerun up to ADAPTER_ATTEMPTS runs in all")
    table = next_tile_table(data, rows)
    print("next power-of-two tiles (planned tile, its UB high-water in bytes; next tile, result, bytes):")
    for line in table:
        print("  " + line)
    if args.report:
        report = {"chip_ub_bytes": chip_ub, "results": results, "failures": failures, "next_tiles": table}
        Path(args.report).write_text(json.dumps(report, indent=1))
    if unsupported:
        print(f"{len(unsupported)} planned launches of {sorted({la['dtype'] for la in unsupported})} data are known "
              f"unsupported by triton-ascend: {sorted(set(KNOWN_UNSUPPORTED.values()))}")  # fmt: skip
    for f in failures:
        print("FAILED", f)
    bad = sum(results[la["spec"]]["status"] != "ok" for la in planned)
    bad += sum(KNOWN_UNSUPPORTED[la["dtype"]] not in results[la["spec"]]["message"] for la in unsupported)
    print(f"{len(planned) + len(unsupported) - bad} passed, {bad} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
