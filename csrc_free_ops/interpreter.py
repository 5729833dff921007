"""The Triton interpreter: whether it was asked for, and asked for in time.

``TRITON_INTERPRET=1`` makes Triton run kernels in Python on CPU tensors.
Triton reads the variable when a function is decorated with ``@triton.jit``,
and ``triton.language`` decorates its own helpers (``tl.cdiv``, the
reductions' combine functions, ...) when triton is first imported.  Set after
that import, even before this package's kernels are defined, the variable
leaves interpreted kernels calling compiled helpers, which fails at the first
launch with "Cannot call @triton.jit'd outside of the scope of a kernel".
``check_requested_in_time`` turns that into an error at import that says
what to do.

Triton 3.6 and older turn a one-element interpreter tensor into a Python int
with ``int(array)``, which recent NumPy releases refuse for 1-d arrays;
every kernel loop that starts at ``tl.program_id`` then fails.
``check_interpreter_runs`` says so at import instead.
"""

from __future__ import annotations

import os


def requested() -> bool:
    """True when TRITON_INTERPRET=1 is set now."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _major_minor(version: str) -> tuple[int, int]:
    parts = (version.split("+")[0].split(".") + ["0", "0"])[:2]
    return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts)  # type: ignore[return-value]


def blocker() -> str | None:
    """Why this Triton's interpreter cannot run the kernels beside this NumPy
    (see the module docstring), or None when it can."""
    try:
        import numpy as np
        import triton
    except ImportError:
        return None
    if _major_minor(triton.__version__) >= (3, 7):
        return None
    try:
        int(np.array([0]))
    except TypeError:
        return (
            f"Triton {triton.__version__}'s interpreter cannot run csrc_free_ops' kernels beside NumPy "
            f"{np.__version__} (it converts 1-element arrays to ints, which this NumPy refuses)"
        )
    return None


def check_interpreter_runs() -> None:
    """RuntimeError if TRITON_INTERPRET=1 is set but the interpreter cannot run the kernels here."""
    reason = blocker() if requested() else None
    if reason:
        raise RuntimeError(
            f"TRITON_INTERPRET=1 is set, but {reason}. Use triton>=3.7 for the interpreter, or unset "
            "TRITON_INTERPRET: CPU tensors then run the pure-PyTorch reference."
        )


def check_requested_in_time() -> None:
    """RuntimeError if TRITON_INTERPRET=1 is set but triton was imported
    before it was (triton.language's helpers are compiled functions)."""
    if not requested():
        return
    try:
        import triton.language as tl
        from triton.runtime.jit import JITFunction
    except ImportError:  # no triton, or a build without these names: nothing to check
        return
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return
    helper = getattr(tl, "cdiv", None)
    if isinstance(helper, JITFunction) and not isinstance(helper, InterpretedFunction):
        raise RuntimeError(
            "TRITON_INTERPRET=1 was set after triton was imported in this process (something imported it "
            "first: transformers' model classes and torch.compile do), so Triton cannot interpret csrc_free_ops' "
            "kernels. Set it before anything imports triton: in the shell (`TRITON_INTERPRET=1 python script.py`) "
            'or in the first lines of the script (`import os; os.environ["TRITON_INTERPRET"] = "1"`, then the '
            "other imports). Unset, CPU tensors run the pure-PyTorch reference instead."
        )
