"""Importing this package defines every op in the ``liger`` namespace:
schema, fake kernel, autograd formula and the CUDA / PrivateUse1 (Ascend NPU)
/ CPU bindings to the launchers in ``csrc_free_ops``."""

from registrations import (
    group_norm,  # noqa: F401
    poly_norm,  # noqa: F401
    rope,  # noqa: F401
)
