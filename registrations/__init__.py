"""Importing this package defines every op in the ``liger`` namespace:
schema, fake kernel, autograd formula and the CUDA / PrivateUse1 (Ascend NPU)
/ CPU bindings to the launchers in ``csrc_free_ops``.  Users import
``csrc_free_ops`` (or ``liger_nn``), which imports this package.  Last, each
op gets its docstring for help() (``_docs``)."""

from registrations import (
    _docs,
    group_norm,  # noqa: F401
    poly_norm,  # noqa: F401
    rope,  # noqa: F401
)

_docs.attach()
