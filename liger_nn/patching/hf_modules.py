"""transformers' modeling modules as the patch meets them: which ones a model's classes come
from, which architecture each is, and the function behind a ``kernels`` function layer."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import nn

MODELS_PREFIX = "transformers.models."

# The versions the patch is tested with: 5.17.0 in CI and on the CUDA machine, the range's ends
# (4.57.1, 5.25.0) by `nox -s transformers`.  On 4.57.1 DeepSeek-V3's interleaved rotary is
# another function and is left alone; the Qwen-VL models are tested on 5.x only.  5.25.0 brings
# the `kernels` package, whose hub decorators make most rotary functions module objects
# (hub_function unwraps them).
TESTED_TRANSFORMERS_VERSIONS: tuple[str, ...] = ("4.57.1", "5.17.0", "5.25.0")


def modeling_modules(model: nn.Module) -> list[str]:
    """The transformers modeling modules that define the model's classes, in first-seen order."""
    seen: dict[str, None] = {}
    for module in model.modules():
        name = type(module).__module__
        if name.startswith(MODELS_PREFIX) and name.rsplit(".", 1)[-1].startswith("modeling_"):
            seen.setdefault(name, None)
    return list(seen)


def arch_of(module_name: str) -> str:
    """The architecture of ``transformers.models.<arch>.modeling_<arch>``."""
    return module_name[len(MODELS_PREFIX) :].split(".", 1)[0]


def hub_function(obj: Callable) -> Callable | None:
    """The function behind a ``kernels`` function layer, or None if ``obj`` is none.

    With the ``kernels`` package installed, transformers (5.x) decorates most
    rotary functions with ``@use_kernel_forward_from_hub("rotary_pos_emb")``,
    which turns the module global into an instance of a one-off ``nn.Module``
    class (kernels' ``_create_func_module``) whose ``forward`` calls the
    function: its own signature is ``(*args, **kwargs)``, its class carries
    ``kernel_layer_name`` and the function's signature on ``forward``."""
    if not isinstance(obj, nn.Module) or not hasattr(type(obj), "kernel_layer_name"):
        return None
    forward = type(obj).forward
    cells = dict(zip(forward.__code__.co_freevars, forward.__closure__ or (), strict=True))
    cell = cells.get("func")
    if cell is not None and inspect.isfunction(cell.cell_contents):
        return cell.cell_contents
    return None


def signature_of(original: Callable) -> inspect.Signature:
    """The parameters ``original`` takes: a kernels function layer's are those of its ``forward`` less ``self``."""
    if isinstance(original, nn.Module) and hasattr(type(original), "kernel_layer_name"):
        signature = inspect.signature(type(original).forward)
        return signature.replace(parameters=list(signature.parameters.values())[1:])
    return inspect.signature(original)
