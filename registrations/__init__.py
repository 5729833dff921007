"""Importing this package defines every op in the ``liger`` namespace:
schema, fake kernel, autograd formula and the CUDA / PrivateUse1 (Ascend NPU)
/ CPU bindings to the launchers in ``csrc_free_ops``; then the rules that
make the ops work inside training stacks (``sharding``: DTensor; ``functorch``: vmap and forward-mode AD).  Each rule
module imports the op modules it extends, so the order below is free.  Users import ``csrc_free_ops`` (or
``liger_nn``), which imports this package.  Last, each op gets its docstring for help() (``_docs``)."""

from registrations import (
    _docs,
    cross_entropy,  # noqa: F401
    functorch,  # noqa: F401
    fused_linear_cross_entropy,  # noqa: F401
    glu,  # noqa: F401
    group_norm,  # noqa: F401
    layer_norm,  # noqa: F401
    poly_norm,  # noqa: F401
    rms_norm,  # noqa: F401
    rope,  # noqa: F401
    rope_inplace,  # noqa: F401  (rope_ under autograd)
    sharding,  # noqa: F401
)

_docs.attach()
