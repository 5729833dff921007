"""Fused Triton kernels for LLM training as ``torch.ops.liger.*`` custom ops (no C++).

``import csrc_free_ops`` defines the ops: this file ends by importing the
registration layer, ``registrations``.  That is the tree's one upward import,
made for users, whose first try is the distribution's name.  Below it the
layers point down as docs/design.md draws them: the modules of this package
(one subpackage per op, ``device.py``, ``launcher.py``, ``host_math.py``,
``interpreter.py``) never import ``registrations``, and the registration
modules hold no kernel code.  Importing any module of the package runs this
file first, so it defines the ops too: once per process, without touching a
device or compiling a kernel.

With ``TRITON_INTERPRET=1`` set before triton is first imported, CPU tensors
run the Triton kernels under the interpreter; without it they run the
pure-PyTorch reference (``<op>/reference.py``).
"""

__version__ = "0.1.0"

from csrc_free_ops import interpreter as _interpreter

_interpreter.check_requested_in_time()
_interpreter.check_interpreter_runs()

import registrations  # noqa: E402,F401  (last, see above: defines torch.ops.liger.*)
