"""rms_norm's module swap: every submodule whose class name ends in ``RMSNorm`` (transformers'
LlamaRMSNorm, Qwen2/3's, Mistral's, GemmaRMSNorm, OLMo2's, ...; ``torch.nn.RMSNorm``) with a
1-D ``weight`` Parameter and a float epsilon (``variance_epsilon`` or ``eps``) becomes a
``liger_nn.RMSNorm`` sharing that weight.

The class's convention (offset and casting mode) is read off its own output: a bfloat16 copy
with a random weight runs on a bfloat16 input, and the first convention whose reference gives
the same bits is the class's (Llama's rounds norm(x) before the weight, Gemma's multiplies by
``1 + weight`` in float32, OLMo2's by the weight in float32).  A class no convention reproduces
is left alone, and so is one whose drop-in then disagrees in float32."""

from __future__ import annotations

import copy
import weakref

import torch
from torch import nn

from csrc_free_ops.rms_norm import reference
from liger_nn.patching.checks import Skip, close
from liger_nn.patching.module_swaps import ModuleRule
from liger_nn.rms_norm import RMSNorm

# (offset, casting_mode) in the order they are tried; the first two differ only in bfloat16.
CONVENTIONS: tuple[tuple[float, str], ...] = ((0.0, "llama"), (0.0, "gemma"), (1.0, "gemma"), (1.0, "llama"))
_CHECK_ROWS = 64
# Each module's convention, read once for the swap and its report line.
_CONVENTION_OF: weakref.WeakKeyDictionary[nn.Module, tuple[float, str]] = weakref.WeakKeyDictionary()


def _eps(module: nn.Module) -> object:
    eps = getattr(module, "variance_epsilon", None)
    return getattr(module, "eps", None) if eps is None else eps


def _is_candidate(module: nn.Module) -> bool:
    return isinstance(module, nn.RMSNorm) or type(module).__name__.endswith("RMSNorm")


def _refusal(module: nn.Module) -> str | None:
    weight, eps = getattr(module, "weight", None), _eps(module)
    name = type(module).__qualname__
    if not isinstance(weight, nn.Parameter) or weight.dim() != 1:
        return f"{name}: no 1-D weight Parameter"
    if not isinstance(eps, float):
        # nn.RMSNorm(eps=None) takes the input dtype's machine epsilon, which the op has no form of.
        return f"{name}: eps is {eps!r}, not a float"
    return None


def _convention(module: nn.Module) -> tuple[float, str]:
    if module not in _CONVENTION_OF:
        _CONVENTION_OF[module] = _read_convention(module)
    return _CONVENTION_OF[module]


def _read_convention(module: nn.Module) -> tuple[float, str]:
    """The (offset, casting_mode) whose reference matches the module's bfloat16 output bit for bit."""
    gen = torch.Generator().manual_seed(0)
    ref = copy.deepcopy(module).to("cpu", torch.bfloat16)
    hidden = ref.weight.shape[0]
    with torch.no_grad():
        ref.weight.copy_(torch.randn(hidden, generator=gen))
        x = torch.randn(_CHECK_ROWS, hidden, generator=gen).to(torch.bfloat16)
        try:
            expected = ref(x)
        except Exception as exc:
            raise Skip(f"patch-time check raised {type(exc).__name__}: {exc}") from None
        for offset, casting_mode in CONVENTIONS:
            got = reference.forward(x, ref.weight, _eps(module), offset, casting_mode)
            if isinstance(expected, torch.Tensor) and expected.dtype == got.dtype and torch.equal(got, expected):
                return offset, casting_mode
    raise Skip("patch-time check: no offset and casting mode of rms_norm reproduces this class's bfloat16 output")


def _build(old: nn.Module) -> RMSNorm:
    offset, casting_mode = _convention(old)
    new = RMSNorm(old.weight.shape[0], _eps(old), offset=offset, casting_mode=casting_mode, device="meta")
    new.weight = old.weight
    new.train(old.training)
    return new


def _check(old: nn.Module) -> None:
    """A convention reproduces the class in bfloat16, and the drop-in agrees with it on a float32 CPU input."""
    ref = copy.deepcopy(old).to("cpu", torch.float32)
    new = _build(ref)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        ref.weight.copy_(torch.randn(ref.weight.shape, generator=gen))
        x = torch.randn(4, ref.weight.shape[0], generator=gen)
        if not close(new(x), ref(x)):
            raise Skip("patch-time check: liger RMSNorm's output differs from this class's")


def _describe(module: nn.Module) -> str:
    offset, casting_mode = _convention(module)
    return f"{type(module).__qualname__} (offset={offset}, casting_mode={casting_mode!r})"


RULE = ModuleRule("rms_norm", RMSNorm, _is_candidate, _refusal, _build, _describe, check=_check)
