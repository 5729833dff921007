"""The registration helper every op module imports: one place for the names
that define an op and its autograd.

* ``define_op``, ``Entries``, ``Prepare``, ``LIB`` (registrations/define.py):
  schema, check, fake kernel, one entry per dispatch key and their prepared
  forms;
* ``register_autograd``, ``call_from_backward``,
  ``register_autograd_by_reference``, ``register_version_bumps``
  (registrations/autograd.py);
* ``JVP_RULES`` (registrations/transforms.py): forward-mode AD rules;
* ``decomposition`` (registrations/decompose.py): whether torch.compile
  traces the ops' kernels into its graphs.

The eager path is registrations/eager.py (public: ``eager_call``).
"""

from registrations.autograd import (
    call_from_backward,
    register_autograd,
    register_autograd_by_reference,
    register_version_bumps,
)
from registrations.decompose import decomposition
from registrations.define import INTERPRETER, LIB, Entries, Prepare, define_op, launch_entries
from registrations.transforms import JVP_RULES

__all__ = [
    "INTERPRETER",
    "JVP_RULES",
    "LIB",
    "Entries",
    "Prepare",
    "call_from_backward",
    "decomposition",
    "define_op",
    "launch_entries",
    "register_autograd",
    "register_autograd_by_reference",
    "register_version_bumps",
]
