"""This package's layers for the HF ``kernels`` mechanism (``kernels.kernelize``).

transformers (5.x, with the ``kernels`` package installed) marks layers and
functions with hub layer names (``@use_kernel_forward_from_hub(name)``) and
``kernels.kernelize(model, mode=...)`` replaces their ``forward`` with the
layer a kernel mapping names for that name, device and mode.  This module
offers ``torch.ops.liger`` to that mechanism, without the Hub: a repository
object whose ``load()`` returns a layer class of this package.

    import liger_nn.hub
    from kernels import Mode, kernelize

    liger_nn.hub.use_liger_kernels()  # or: with kernels.use_kernel_mapping(liger_nn.hub.kernel_mapping()):
    kernelize(model, mode=Mode.TRAINING)

Hub layer names served (``LAYERS``): ``"rotary_pos_emb"``, the name of
transformers' Llama-style ``apply_rotary_pos_emb`` (rotate_half over the
first ``cos.shape[-1]`` dims).  Neither transformers (5.25) nor diffusers
(0.42) gives GroupNorm or PolyNorm a hub name; ``apply_liger_ops`` swaps those.

The name is shared by every architecture that decorates its rotary function,
so the layer checks each function numerically against the op, once per
function, before routing it (the check ``apply_liger_ops`` makes): a function
that disagrees, or takes other parameters, keeps its own code and a
``LigerPatchWarning`` says so.  The checks run when the mapping is registered
(for the modeling modules imported by then), when ``kernelize`` first loads
the layer, and else on the first eager call; a function first met inside a
``torch.compile`` trace raises instead (kernelize, then run once eagerly or
call ``use_liger_kernels()`` again after importing the model).

Like ``apply_liger_ops``' rotary swap, this is process-wide: the decorated
function is one module object shared by every model of the architecture.
``kernelize`` with a mapping without the name (e.g. inside
``use_kernel_mapping({}, inherit_mapping=False)``) puts the original back.
"""

from __future__ import annotations

import sys
import warnings

import torch
from torch import nn

from liger_nn.patching.checks import Skip
from liger_nn.patching.hf_modules import MODELS_PREFIX, hub_function, signature_of
from liger_nn.patching.report import LigerPatchWarning
from liger_nn.patching.rope_check import check_rope
from liger_nn.patching.rope_dropin import make_hf_rope
from liger_nn.patching.rope_table import ROPE_CONVENTIONS, ROPE_PREFIX
from liger_nn.rope import apply_rotary_pos_emb

ROTARY_LAYER_NAME = "rotary_pos_emb"
# kernels' device types this package's ops run on: CUDA, Ascend (torch_npu) and the CPU
# (the Triton interpreter under TRITON_INTERPRET=1, else the reference).
DEVICES: tuple[str, ...] = ("cuda", "npu", "cpu")

_FORWARD_PARAMETERS = ["q", "k", "cos", "sin", "unsqueeze_dim"]
# Decorated class -> whether its function is routed through the op (the check passed).
_VERDICTS: dict[type, bool] = {}


class LigerRotaryPosEmb(nn.Module):
    """The ``forward`` kernelize gives transformers' ``"rotary_pos_emb"`` function
    layers: ``torch.ops.liger.rope`` (``liger_nn.apply_rotary_pos_emb``) where
    that function passed the check, its own code elsewhere.

    Stateless and without members beyond kernels' flags, as kernels requires:
    ``self`` is the decorated function's module object."""

    has_backward = True
    can_torch_compile = True

    def forward(self, q, k, cos, sin, unsqueeze_dim=None):
        # None: not passed (1 for the op); a function that failed the check gets the arguments as they came.
        if _routes(self):
            return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1 if unsqueeze_dim is None else unsqueeze_dim)
        if unsqueeze_dim is None:
            return type(self).forward(self, q, k, cos, sin)
        return type(self).forward(self, q, k, cos, sin, unsqueeze_dim)


LAYERS: dict[str, type[nn.Module]] = {ROTARY_LAYER_NAME: LigerRotaryPosEmb}


class LigerLayerRepository:
    """A ``kernels`` repository (``load()`` returns the layer class) for a layer
    of this package: nothing is downloaded."""

    def __init__(self, layer: type[nn.Module]) -> None:
        self._layer = layer

    @property
    def layer_name(self) -> str:
        return self._layer.__name__

    def load(self) -> type[nn.Module]:
        if self._layer is LigerRotaryPosEmb:
            check_rotary_functions()
        return self._layer

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LigerLayerRepository) and other._layer is self._layer

    def __hash__(self) -> int:
        return hash(self._layer)

    def __str__(self) -> str:
        return f"liger_nn.hub.{self._layer.__name__} (torch.ops.liger, no download)"


def kernel_mapping(devices: tuple[str, ...] = DEVICES) -> dict:
    """The mapping for ``kernels.use_kernel_mapping`` / ``register_kernel_mapping``:
    each name of ``LAYERS`` -> each device -> this package's layer, for every mode
    (the layers have a backward and compile)."""
    return {name: {device: LigerLayerRepository(layer) for device in devices} for name, layer in LAYERS.items()}


def use_liger_kernels(devices: tuple[str, ...] = DEVICES) -> None:
    """Register ``kernel_mapping()`` with ``kernels`` (in the current context,
    normally global), so that ``kernelize`` picks this package's layers, and
    check the rotary functions of the modeling modules imported so far."""
    try:
        import kernels
    except ImportError as exc:
        raise ImportError(
            "liger_nn.hub needs the `kernels` package (pip install kernels, or transformers[kernels])"
        ) from exc
    kernels.register_kernel_mapping(kernel_mapping(devices))
    check_rotary_functions()


def _is_rotary_layer(obj: object) -> bool:
    return isinstance(obj, nn.Module) and getattr(type(obj), "kernel_layer_name", None) == ROTARY_LAYER_NAME


def check_rotary_functions() -> dict[str, bool]:
    """Check every ``"rotary_pos_emb"`` function layer of the transformers
    modeling modules imported so far (once each); returns qualified name ->
    whether it is routed through the op."""
    verdicts = {}
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith(MODELS_PREFIX) or module is None:
            continue
        for name, obj in list(vars(module).items()):
            if name.startswith(ROPE_PREFIX) and _is_rotary_layer(obj):
                verdicts[f"{module_name}.{name}"] = _routes(obj)
    return verdicts


def _routes(layer: nn.Module) -> bool:
    verdict = _VERDICTS.get(type(layer))
    if verdict is None:
        if torch.compiler.is_compiling():
            raise RuntimeError(
                f"liger_nn.hub: {_describe(layer)} was not checked against torch.ops.liger.rope before this "
                "torch.compile trace; call liger_nn.hub.use_liger_kernels() (or run the model once eagerly) "
                "after kernelize and before compiling"
            )
        verdict = _VERDICTS[type(layer)] = _check(layer)
    return verdict


def _describe(layer: nn.Module) -> str:
    function = hub_function(layer)
    name = f"{function.__module__}.{function.__qualname__}" if function is not None else type(layer).__qualname__
    return f"the rotary function {name} (hub layer {ROTARY_LAYER_NAME!r})"


def _check(layer: nn.Module) -> bool:
    """The patch-time check of ``apply_liger_ops``, on the layer's own ``forward``."""

    def original(*args, **kwargs):
        return type(layer).forward(layer, *args, **kwargs)

    original.__signature__ = signature_of(layer)
    convention = ROPE_CONVENTIONS["halves"]
    try:
        if list(original.__signature__.parameters) != _FORWARD_PARAMETERS:
            raise Skip(f"it takes {original.__signature__}, the layer (q, k, cos, sin, unsqueeze_dim=1)")
        replacement = make_hf_rope(original, convention.adapter)
        check_rope(original, replacement, convention)
    except Skip as why:
        warnings.warn(
            f"liger_nn.hub: {_describe(layer)} keeps its own code under kernelize: {why}",
            LigerPatchWarning,
            stacklevel=2,
        )
        return False
    return True
