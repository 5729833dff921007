"""What a newcomer meets first: the import that defines the ops, the error
for TRITON_INTERPRET set too late, help() on an op, the demo's legend and
speed table, the package metadata, and the layering the tree keeps."""

from __future__ import annotations

import ast
import os
import pydoc
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import demo
from registrations import _docs
from tests.test_readme import nox_constant

ROOT = Path(__file__).resolve().parent.parent


def _fresh_python(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a new interpreter on this tree, TRITON_INTERPRET unset."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


# --- the first import ------------------------------------------------------


def test_importing_the_package_or_only_a_kernel_module_defines_the_ops():
    """`import csrc_free_ops.<op>.kernels` (what the Ascend compile check
    does) runs the package's __init__, which defines the ops: the kernel
    import works, and so does `import csrc_free_ops`."""
    done = _fresh_python(
        "import sys, torch\n"
        "import csrc_free_ops.poly_norm.kernels\n"
        "print(sorted(n for n in ('poly_norm', 'rope', 'group_norm') if hasattr(torch.ops.liger, n)))\n"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[0] == "['group_norm', 'poly_norm', 'rope']"


def test_triton_interpret_set_after_triton_was_imported_fails_at_import_saying_what_to_do():
    done = _fresh_python(
        "import os\nimport triton  # as transformers' model classes do\n"
        "os.environ['TRITON_INTERPRET'] = '1'\nimport csrc_free_ops\n"
    )
    assert done.returncode != 0
    assert "RuntimeError: TRITON_INTERPRET=1 was set after triton was imported" in done.stderr, done.stderr[-3000:]
    assert "before anything imports triton" in done.stderr


def _numpy_refuses_int_of_a_1d_array() -> bool:
    import numpy as np

    try:
        int(np.array([0]))
    except TypeError:
        return True
    return False


def test_an_interpreter_that_cannot_run_the_kernels_beside_this_numpy_fails_at_import(monkeypatch):
    """Triton 3.6's interpreter int()s 1-element arrays, which NumPy 2.4.6 and later refuse (seen on the
    H200 machine: every loop starting at tl.program_id failed); 3.7 squeezes them first.  Checked for this
    machine's Triton and for either side of 3.7, beside this machine's NumPy: the refusal is expected exactly
    when Triton is older than 3.7 and NumPy refuses."""
    import triton

    from csrc_free_ops import interpreter

    numpy_refuses = _numpy_refuses_int_of_a_1d_array()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for version in (triton.__version__, "3.6.0", "3.7.0"):
        monkeypatch.setattr(triton, "__version__", version)
        if numpy_refuses and interpreter._major_minor(version) < (3, 7):
            assert interpreter.blocker() is not None, version
            refused = rf"Triton {re.escape(version)}'s interpreter cannot run .*triton>=3\.7"
            with pytest.raises(RuntimeError, match=refused):
                interpreter.check_interpreter_runs()
        else:
            assert interpreter.blocker() is None, version
            interpreter.check_interpreter_runs()
    monkeypatch.delenv("TRITON_INTERPRET")
    interpreter.check_interpreter_runs()  # not asked for: nothing to refuse


# --- help() on an op ---------------------------------------------------------


def _ops_doc_anchors() -> set[str]:
    text = (ROOT / "docs" / "ops.md").read_text(encoding="utf-8")
    return {_docs._anchor(line[3:]) for line in text.splitlines() if line.startswith("## ")}


@pytest.mark.parametrize("op", _docs.op_names())
def test_help_on_an_op_gives_schema_shapes_dtypes_and_docs_section(op):
    packet = getattr(torch.ops.liger, op)
    module = _docs.defining_modules().get(op)
    assert module is not None, f"{op}: no registrations module holds it at module level"
    described = _docs.section(module.__doc__, op)
    assert described, f"{module.__name__}'s docstring has no section starting '{op}('"
    text = pydoc.render_doc(packet, renderer=pydoc.plaintext)
    for overload in packet.overloads():
        assert str(getattr(packet, overload)._schema) in text
        assert getattr(packet, overload).__doc__ == packet.__doc__
    assert described.splitlines()[-1].strip() in text
    anchor = re.search(r"docs/ops\.md#([\w-]+)", text)
    assert anchor and anchor.group(1) in _ops_doc_anchors(), text[-300:]


def test_docstring_section_is_the_ops_own_lines():
    doc = "Title.\n\nrope(q) -> out\n    q: (B, H, S, D)\n\n    more\nrope_(q) -> ()\n    in place\n"
    assert _docs.section(doc, "rope") == "rope(q) -> out\n    q: (B, H, S, D)\n\n    more"
    assert _docs.section(doc, "rope_") == "rope_(q) -> ()\n    in place"
    assert _docs.section(doc, "rope_backward") == ""


# --- the demo ----------------------------------------------------------------


def test_demo_legend_and_cpu_comparison_say_what_the_numbers_are():
    legend = demo.legend("cpu")
    assert "max |ours - reference| / max |reference|" in legend
    assert "say nothing about speed" in legend
    assert "say nothing about speed" not in demo.legend("cuda")
    report = demo.comparison_report("cpu")
    assert report.startswith("Speed against upstream Liger-Kernel and torch.compile: skipped on the CPU.")


def test_demo_comparison_times_ours_and_each_rival_and_reports_a_missing_one(monkeypatch):
    from bench import providers

    class Fake:
        def __init__(self, provider):
            self.provider = provider

        def prepare(self):
            pass

        def full_timer(self):
            return self.provider

    def build(op, provider, shape, device):
        if provider == "liger_kernel":
            raise providers.ProviderUnavailable("liger_kernel not importable: ModuleNotFoundError")
        return Fake(provider)

    monkeypatch.setattr(providers, "build", build)
    results = demo.compare("cuda", timer={"liger": 2.0, "compile": 3.0}.get)
    assert set(results) == {"poly_norm", "rope", "group_norm"}
    assert results["rope"]["liger"] == 2.0 and results["rope"]["compile"] == 3.0
    table = demo.format_comparison(results, None)
    lines = table.splitlines()
    assert "| rope | 2.000 | not run | - | 3.000 | 1.50 |" in lines
    assert lines[-1] == "Liger-Kernel not run: liger_kernel not importable: ModuleNotFoundError"  # once


def test_demo_comparison_fails_when_ours_fails(monkeypatch):
    from bench import providers

    def build(op, provider, shape, device):
        raise ValueError("ours broke")

    monkeypatch.setattr(providers, "build", build)
    with pytest.raises(ValueError, match="ours broke"):
        demo.compare("cuda", timer=lambda fn: 1.0)


# --- metadata ----------------------------------------------------------------


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def test_metadata_declares_numpy_and_one_transformers_range():
    project = _pyproject()["project"]
    assert any(re.match(r"numpy\b", r) for r in project["dependencies"]), "the Triton interpreter needs numpy"
    extras = project["optional-dependencies"]
    (hf,) = (r for r in extras["hf"] if r.startswith("transformers"))
    assert hf in extras["test"], "the test extra states the hf range"
    low, high = re.fullmatch(r"transformers>=([\d.]+),<([\d.]+)", hf).groups()
    pinned = nox_constant("TRANSFORMERS").split("==")[1]
    assert _version(low) <= _version(pinned) < _version(high), "the tests session's transformers is in the range"
    from liger_nn.patching import TESTED_TRANSFORMERS_VERSIONS

    newest = nox_constant("TRANSFORMERS_NEWEST").split("==")[1]
    tested = TESTED_TRANSFORMERS_VERSIONS
    assert {low, pinned, newest} <= set(tested), ("nox -s transformers runs these", tested)
    assert all(_version(low) <= _version(v) < _version(high) for v in tested)
    assert _version(newest) == max(map(_version, tested)), "the newest end is the newest version tested"
    # The range ends right after the newest release tested: "<5.26" for 5.25.x.
    assert _version(high)[:2] == (_version(newest)[0], _version(newest)[1] + 1), (high, newest)


# --- layering ----------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_layers_point_down_but_for_the_package_init():
    for path in sorted((ROOT / "csrc_free_ops").rglob("*.py")):
        up = _imports(path) & {"registrations", "liger_nn", "bench"}
        if path == ROOT / "csrc_free_ops" / "__init__.py":
            assert up == {"registrations"}, up
        else:
            assert not up, f"{path.relative_to(ROOT)} imports {up}"
    for path in sorted((ROOT / "registrations").rglob("*.py")):
        assert not _imports(path) & {"liger_nn", "bench"}, path
        assert "triton.jit" not in path.read_text(encoding="utf-8"), f"{path}: kernel code in a registration module"
