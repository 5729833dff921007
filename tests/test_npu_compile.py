"""The Ascend compile check (tests/npu_launch_specs.py, tests/npu_compile_check.py).

The first test runs in the CPU suite: the recorded NPU launches reach every
kernel and constexpr branch the NPU plans can take, so the compile check
(``nox -s npu_compile``) covers them all.  The second runs that check itself
and is skipped unless triton-ascend is at hand: importable here, or a Python
that has it named by CSRC_FREE_OPS_ASCEND_PYTHON."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# (kernel, constexprs it must be launched with at least once); {} = launched at all.
NPU_BRANCHES = [
    ("fwd_tile_kernel", {"GRID_STRIDE": True}),
    ("fwd_tile_kernel", {"GRID_STRIDE": False}),
    ("fwd_blocked_kernel", {}),
    ("bwd_tile_kernel", {}),
    ("bwd_blocked_kernel", {}),
    ("reduce_param_grads_kernel", {}),
    *[
        ("rope_kernel", {"BACKWARD": b, "COPY_PASS": c, "HEADS_FIT": f})
        for b, c, f in itertools.product((False, True), repeat=3)
    ],
    *[("rope_kernel", {"X_PAIRS": x, "Y_PAIRS": y}) for x, y in itertools.product((False, True), repeat=2)],
    *[("rope_kernel", {"POSITIONS": p}) for p in (0, 1, 2)],
    *[("rope_kernel", {"MROPE": m}) for m in (0, 1, 2)],
    ("rope_kernel", {"POSITIONS": 2, "BLOCK_SEQS": 256}),  # plan.NPU_MAX_SEQS_BLOCK: the start search loops
    ("fwd_whole_kernel", {"HAS_W": True, "HAS_B": True}),
    ("fwd_whole_kernel", {"HAS_W": False, "HAS_B": False}),
    ("bwd_whole_kernel", {"PARAM_GRADS": True}),
    ("bwd_whole_kernel", {"PARAM_GRADS": False, "DIRECT_GRADS": False}),
    ("bwd_whole_kernel", {"DIRECT_GRADS": True}),
    ("fwd_partials_kernel", {}),
    ("fwd_finalize_kernel", {}),
    ("fwd_apply_kernel", {"FUSED": True}),
    ("fwd_apply_kernel", {"FUSED": False}),
    ("bwd_partials_kernel", {}),
    ("bwd_finalize_kernel", {}),
    ("bwd_dx_kernel", {"FUSED": True, "HAS_W": True}),
    ("bwd_dx_kernel", {"FUSED": False, "HAS_W": False}),
    ("reduce_param_grads_kernel", {"HAS_W": True, "HAS_B": True}),  # group_norm's (poly_norm's has no HAS_W)
    # group_norm's activation="silu": each tile kernel with it, and the backward's statistics pass
    ("fwd_whole_kernel", {"ACTIVATION": "silu"}),
    ("bwd_whole_kernel", {"ACTIVATION": "silu"}),
    ("fwd_apply_kernel", {"ACTIVATION": "silu"}),
    ("bwd_partials_kernel", {"ACTIVATION": "silu", "HAS_DY": False}),
    ("bwd_finalize_kernel", {"HAS_DY": False}),
    ("bwd_partials_kernel", {"ACTIVATION": "silu", "HAS_DY": True}),
    ("bwd_dx_kernel", {"ACTIVATION": "silu"}),
]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _record(python: str, out: Path) -> dict:
    done = subprocess.run([python, "-m", "tests.npu_launch_specs", str(out)], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


def test_launch_specs_reach_every_npu_kernel_branch(tmp_path):
    data = _record(sys.executable, tmp_path / "specs.json")
    planned = [data["specs"][la["spec"]] for la in data["launches"] if la["role"] == "model"]
    missing = [
        (kernel, flags)
        for kernel, flags in NPU_BRANCHES
        if not any(s["kernel"] == kernel and flags.items() <= s["constexprs"].items() for s in planned)
    ]
    assert not missing, f"no recorded NPU launch of {missing}: add a shape to tests/npu_launch_specs.py"
    x_types = {next(iter(s["signature"].values())) for s in planned if s["kernel"] != "reduce_param_grads_kernel"}
    assert {"*fp32", "*bf16", "*fp16"} <= x_types


def _ascend_python() -> str | None:
    named = os.environ.get("CSRC_FREE_OPS_ASCEND_PYTHON")
    if named:
        return named
    if importlib.util.find_spec("triton") and importlib.util.find_spec("triton.backends.ascend"):
        return sys.executable
    return None


@pytest.mark.skipif(_ascend_python() is None, reason="triton-ascend is not installed (nox -s npu_compile runs this)")
def test_every_npu_launch_compiles_with_triton_ascend(tmp_path):
    specs = tmp_path / "specs.json"
    _record(sys.executable, specs)
    done = subprocess.run([_ascend_python(), "-m", "tests.npu_compile_check", str(specs)], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=3600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]
    assert " 0 failed" in done.stdout


def test_the_adapter_stage_reruns_a_signal_death_and_counts_it_but_never_an_error_exit(tmp_path):
    """triton-adapter-opt dies by a signal on a few percent of its runs of the same input: the check runs it
    again (at most ADAPTER_ATTEMPTS runs in all) and counts each death; an error exit is a verdict, never rerun."""
    from tests import npu_compile_check as check

    runs = tmp_path / "runs"
    dies_twice = f"n=$(cat {runs} 2>/dev/null || echo 0); echo $((n + 1)) > {runs}; [ $n -ge 2 ] || kill -SEGV $$"
    state: dict = {}
    done = check._run_adapter(["sh", "-c", dies_twice], state, capture_output=True, check=True)
    assert done.returncode == 0 and state["adapter_deaths"] == 2 and runs.read_text().strip() == "3"

    state = {}
    with pytest.raises(subprocess.CalledProcessError) as failed:
        check._run_adapter(["sh", "-c", "exit 3"], state, capture_output=True, check=True)
    assert failed.value.returncode == 3 and state.get("adapter_deaths", 0) == 0

    state = {}
    with pytest.raises(subprocess.CalledProcessError) as died:
        check._run_adapter(["sh", "-c", "kill -ABRT $$"], state, capture_output=True, check=True)
    assert died.value.returncode < 0 and state["adapter_deaths"] == check.ADAPTER_ATTEMPTS
