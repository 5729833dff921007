"""Whether any code of a model's classes names a module global: the static "never called" check."""

from __future__ import annotations

import inspect
import types
from types import ModuleType

from torch import nn


def _code_refers_to(code: types.CodeType, name: str) -> bool:
    return name in code.co_names or any(
        isinstance(c, types.CodeType) and _code_refers_to(c, name) for c in code.co_consts
    )


def model_refers_to(model: nn.Module, module: ModuleType, name: str) -> bool:
    """Whether a function of one of the model's classes (their MROs) that looks up
    globals in ``module`` names ``name`` (the way an attention ``forward`` calls
    ``apply_rotary_pos_emb``).  A static check, no forward: a name reached only
    another way (an attribute, a registry, another module's global) does not count."""
    namespace = vars(module)
    classes = {cls for m in model.modules() for cls in type(m).__mro__}
    for cls in classes:
        for attr_name, attr in vars(cls).items():
            if attr_name == "__init__":  # a function bound at construction is not the global called later
                continue
            function = getattr(attr, "__func__", attr)  # staticmethod, classmethod
            if callable(function):
                function = inspect.unwrap(function)  # decorators made with functools.wraps
            if inspect.isfunction(function) and function.__globals__ is namespace:
                if _code_refers_to(function.__code__, name):
                    return True
    return False
