"""A rotary function's drop-in: the original's parameters, the convention's liger adapter behind them."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

from torch import nn

from liger_nn.patching.checks import Skip
from liger_nn.patching.hf_modules import hub_function, signature_of


def make_hf_rope(original: Callable, adapter: Callable) -> Callable:
    """A function with the original's parameters that calls ``adapter``
    (which takes q, k, cos, sin[, unsqueeze_dim=...]).  Accepted: transformers
    5.x's (q, k, cos, sin, unsqueeze_dim=1), 4.x's (q, k, cos, sin,
    position_ids=None, unsqueeze_dim=1) and the vision form (q, k, cos, sin),
    as plain functions or as ``kernels`` function layers (``hub_function``)."""
    signature = signature_of(original)
    params = signature.parameters
    names = list(params)
    defaults = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
    if names == ["q", "k", "cos", "sin", "unsqueeze_dim"] and defaults == {"unsqueeze_dim": 1}:

        def liger_rope(q, k, cos, sin, unsqueeze_dim=1):
            return adapter(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)

    elif names == ["q", "k", "cos", "sin", "position_ids", "unsqueeze_dim"] and defaults == {
        "position_ids": None,
        "unsqueeze_dim": 1,
    }:

        def liger_rope(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
            return adapter(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)

    elif names == ["q", "k", "cos", "sin"] and not defaults:

        def liger_rope(q, k, cos, sin):
            return adapter(q, k, cos, sin)

    else:
        raise Skip(f"unknown signature {signature}")
    wrapped = hub_function(original) or original
    functools.update_wrapper(liger_rope, wrapped, updated=() if isinstance(wrapped, nn.Module) else ("__dict__",))
    del liger_rope.__wrapped__  # not a wrapper: inspect/dynamo must not look through it
    liger_rope.__liger_original__ = original
    return liger_rope
