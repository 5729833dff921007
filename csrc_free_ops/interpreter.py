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
"""

from __future__ import annotations

import os


def requested() -> bool:
    """True when TRITON_INTERPRET=1 is set now."""
    return os.environ.get("TRITON_INTERPRET") == "1"


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
