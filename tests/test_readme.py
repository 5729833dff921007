"""The README, checked: its Python blocks run as written (each in a fresh
process; a block that uses "cuda" only where CUDA is), and what it says of
the nox sessions, the package's extras and the ops matches noxfile.py,
pyproject.toml and torch.ops.liger."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from csrc_free_ops import interpreter

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, flags=re.S | re.M)


PYTHON_BLOCKS = code_blocks("python")


def _needs_cuda(code: str) -> bool:
    return bool(re.search(r"""["']cuda["']|\.cuda\(""", code))


def _section(title: str) -> str:
    """The README's text under ``## <title>`` up to the next ``## `` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, flags=re.S | re.M)
    assert match, f"README has no section '## {title}'"
    return match.group(1)


def _table(text: str) -> dict[str, list[str]]:
    """First-column name (in backticks) -> the row's cells, for the markdown table rows of ``text``."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) > 1:
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_readme_has_a_cpu_and_a_cuda_example():
    assert any(not _needs_cuda(c) for c in PYTHON_BLOCKS), "no CPU example"
    assert any(_needs_cuda(c) for c in PYTHON_BLOCKS), "no CUDA example"


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_readme_python_block_runs_as_written(index, tmp_path):
    """In a fresh interpreter, with TRITON_INTERPRET unset: a block that
    needs the interpreter must set it itself, as the README tells users to."""
    code = PYTHON_BLOCKS[index]
    if _needs_cuda(code) and not torch.cuda.is_available():
        pytest.skip("a CUDA example; no CUDA device here")
    if "TRITON_INTERPRET" in code and interpreter.blocker():
        pytest.skip(interpreter.blocker())
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"README python block {index} failed:\n{code}\n{done.stderr[-4000:]}"
    assert "pure-PyTorch reference" not in done.stderr, "the CPU example ran the reference, not the kernels"


# --- nox sessions ----------------------------------------------------------


def _noxfile() -> ast.Module:
    return ast.parse((ROOT / "noxfile.py").read_text(encoding="utf-8"))


def nox_sessions() -> dict[str, str | None]:
    """Session name -> its venv_backend argument (None: the default, a venv of its own)."""
    sessions = {}
    for node in _noxfile().body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            call = deco if isinstance(deco, ast.Call) else None
            target = call.func if call else deco
            if ast.unparse(target) != "nox.session":
                continue
            kwargs = {k.arg: ast.literal_eval(k.value) for k in (call.keywords if call else [])}
            sessions[kwargs.get("name", node.name)] = kwargs.get("venv_backend")
    return sessions


def nox_constant(name: str):
    for node in _noxfile().body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"noxfile.py defines no {name}")


def test_readme_names_only_sessions_the_noxfile_has():
    sessions = nox_sessions()
    named = set(re.findall(r"nox (?:-\w+ )*-s (\w+)", README))
    assert named and named <= set(sessions), named - set(sessions)


def test_readme_sessions_table_lists_every_session_and_its_environment_truly():
    sessions = nox_sessions()
    table = _table(_section("nox sessions"))
    assert set(table) == set(sessions), "README's sessions table and noxfile.py differ"
    for name, (environment, _) in table.items():
        uses_active = sessions[name] == "none"
        assert ("active" in environment) == uses_active, f"{name}: README says '{environment}'"


def test_readme_states_the_pins_the_tests_session_installs():
    row = " ".join(_table(_section("nox sessions"))["tests"])
    for pin in [*nox_constant("CPU_PINS"), nox_constant("TRANSFORMERS")]:
        assert f"`{pin}`" in row, pin


# --- install and extras ----------------------------------------------------


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_readme_ops_table_lists_every_op_of_the_library():
    """Every op torch.ops.liger holds has a row (its backward ops, in place or not, and its with-grads
    training forward, in the row's last cell), and no row names an op it does not hold."""
    import registrations  # noqa: F401  (defines torch.ops.liger.*)

    table = _table(_section("Ops"))
    ops = {
        name for name in dir(torch.ops.liger) if isinstance(getattr(torch.ops.liger, name), torch._ops.OpOverloadPacket)
    }
    suffix = r"(_backward_?|_with_grads)$"
    backward = {name: re.sub(suffix, "", name) for name in ops if re.search(suffix, name)}
    assert set(table) == ops - set(backward), "README's ops table and torch.ops.liger differ"
    for name, forward in backward.items():
        assert f"`{name}(" in table[forward][-1], f"{name} is not in its op's row"


def test_readme_extras_table_matches_pyproject():
    extras = _pyproject()["project"]["optional-dependencies"]
    table = _table(_section("Install"))
    assert set(table) == set(extras)
    for name, requirements in extras.items():
        for requirement in requirements:
            assert f"`{requirement}`" in table[name][0], (name, requirement)
    assert set(re.findall(r"\.\[(\w+)\]", README)) <= set(extras)
