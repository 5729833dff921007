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

PASS_MARK = "returning module before running external compiler"
OVERFLOW = re.compile(r"ub overflow, requires (\d+) bits while (\d+) bits available")
RETRIED = "Ub overflow detected"
# hivm.hir.pointer_cast(%c32768_i64[, %c...]) : memref<8x1024xbf16, #hivm.address_space<ub>>
UB_BUFFER = re.compile(r"hivm\.hir\.pointer_cast\(([^)]*)\)\s*:\s*memref<([^,>]*?)x?(\w+)(?:,[^>]*)?,\s*#hivm\.address_space<ub>>")
ELEMENT_BITS = {"f64": 64, "i64": 64, "f32": 32, "i32": 32, "f16": 16, "bf16": 16, "i16": 16, "i8": 8, "i1": 8}


def _ascend_backend():
    """triton-ascend's compiler class and its module's globals (the backend
    registry loads it under a private module name)."""
    from triton.backends import backends

    if "ascend" not in backends:
        raise SystemExit("this Triton has no Ascend backend: run in the venv with triton-ascend (nox -s npu_compile)")
    cls = backends["ascend"].compiler
    return cls, cls.add_stages.__globals__


def _patch_backend(state: dict) -> None:
    """Point the backend's npubin stage at the chip in ``state["chip"]`` and
    keep bishengir's temporaries in ``state["temps"]``; everything else (the
    flags it passes, the metadata it parses) is the backend's own."""
    _, g = _ascend_backend()

    class _Utils:
        def get_arch(self) -> str:
            return state["chip"]

    def run(cmd, *args, **kwargs):
        if cmd and str(cmd[0]).endswith("bishengir-compile"):
            cmd = [*cmd, f"--save-temps={state['temps']}"]
        return subprocess.run(cmd, *args, **kwargs)

    g["NPUUtils"] = _Utils
    g["subprocess"] = types.SimpleNamespace(run=run, check_call=subprocess.check_call, PIPE=subprocess.PIPE)


def _ub_high_water(hivm: str) -> int:
    """Bytes of UB the final HIVM module addresses: the end of its furthest buffer."""
    top = 0
    for offsets, dims, elem in UB_BUFFER.findall(hivm):
        n = 1
        for d in dims.split("x") if dims else ():
            n *= int(d) if d.isdigit() else 0
        size = n * ELEMENT_BITS.get(elem, 32) // 8
        for off in re.findall(r"%c(\d+)_i64", offsets):
            top = max(top, int(off) + size)
    return top


def _message(text: str) -> str:
    errors = [ln.strip() for ln in text.splitlines() if "error" in ln.lower()]
    return " | ".join(errors[:3])[:600] or text.strip()[-600:]


_STATE: dict = {}


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
    constants = {**spec["constexprs"], **{n: 1 for n in spec["equal_to_1"]}}
    result = {"status": "", "ub_bytes": None, "required_bytes": None, "available_bytes": None, "message": ""}
    with tempfile.TemporaryDirectory() as temps:
        _STATE.update(chip=spec["chip"], temps=temps)
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
    return result


def _plan(launch: dict, spec: dict) -> str:
    consts = ", ".join(f"{k}={v}" for k, v in spec["constexprs"].items())
    return (f"{launch['entry']} shape={launch['shape']} {launch['dtype']} {launch['profile']} "
            f"ub={launch['ub_bytes']} -> {spec['kernel']}[{launch['grid']}]({consts})")  # fmt: skip


def compile_key(spec: dict) -> str:
    fields = ("module", "kernel", "signature", "constexprs", "divisible_16", "equal_to_1", "chip")
    return json.dumps([spec[f] for f in fields], sort_keys=True)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs")
    ap.add_argument("--report", help="write every spec's result and the verdicts here (JSON)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    if shutil.which("bishengir-compile") is None:
        print("bishengir-compile is not on PATH (pip install ascendnpu-ir; its bin/ folder)", file=sys.stderr)
        return 2
    data = json.loads(Path(args.specs).read_text())
    specs, launches = data["specs"], data["launches"]

    t0 = time.time()
    ids = list(specs)
    with tempfile.TemporaryDirectory() as cache, ProcessPoolExecutor(args.jobs, initializer=_init_worker,
                                                                      initargs=(cache,)) as pool:  # fmt: skip
        results = dict(zip(ids, pool.map(compile_spec, [specs[i] for i in ids], chunksize=4), strict=True))
    elapsed = time.time() - t0

    failures, next_tiles = [], []
    planned = collections.defaultdict(set)  # run -> its planned specs
    for la in launches:
        if la["role"] == "model":
            planned[_run_key(la)].add(la["spec"])
    for la in launches:
        spec, res = specs[la["spec"]], results[la["spec"]]
        if la["role"] == "model" and res["status"] != "ok":
            failures.append(f"{res['status']}: {_plan(la, spec)}: {res['message'] or res['status']}")
        elif la["role"] == "next" and la["spec"] not in planned[_run_key(la)] and not la["ub_bytes"] <= 16384:
            next_tiles.append((la, spec, res))
    failures = sorted(set(failures))

    status = collections.Counter(results[la["spec"]]["status"] for la in launches if la["role"] == "model")
    print(f"compiled {len(specs)} specs in {elapsed:.0f} s with {args.jobs} jobs; planned launches by result: "
          f"{dict(status)}")  # fmt: skip
    _print_next(next_tiles)
    if args.report:
        Path(args.report).write_text(json.dumps({"results": results, "failures": failures}, indent=1))
    for f in failures:
        print("FAILED", f)
    n_model = sum(la["role"] == "model" for la in launches)
    print(f"{n_model - len([la for la in launches if la['role'] == 'model' and results[la['spec']]['status'] != 'ok'])}"
          f" passed, {sum(1 for la in launches if la['role'] == 'model' and results[la['spec']]['status'] != 'ok')}"
          " failed")  # fmt: skip
    return 1 if failures else 0


def _run_key(la: dict) -> tuple:
    return la["entry"], json.dumps(la["shape"]), la["dtype"], la["profile"]


def _print_next(next_tiles: list) -> None:
    by = collections.defaultdict(list)
    for la, spec, res in next_tiles:
        by[res["status"]].append((la, spec, res))
    for status, rows in sorted(by.items()):
        print(f"next power-of-two tiles: {len(rows)} {status}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
