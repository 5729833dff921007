"""rope's swap: the module-level rotary functions of the transformers modeling modules a model's
classes come from, for the architectures allowed, each replaced by its convention's drop-in
(rope_table.py) once it passed the check.  The attention ``forward`` looks the name up in its
module's globals on every call, so the swap is process-wide for that architecture, shared by
every patch that holds it (global_swaps.py)."""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from types import ModuleType

from torch import nn

from liger_nn.patching.bytecode_scan import model_refers_to
from liger_nn.patching.checks import Skip
from liger_nn.patching.global_swaps import GlobalSwaps, SwappedFunctions
from liger_nn.patching.handle import LigerPatch
from liger_nn.patching.hf_modules import arch_of, modeling_modules
from liger_nn.patching.report import Replacement
from liger_nn.patching.rope_check import check_rope
from liger_nn.patching.rope_dropin import make_hf_rope
from liger_nn.patching.rope_table import DEFAULT_ROPE_FUNCTIONS, ROPE_CONVENTIONS, ROPE_FUNCTIONS, ROPE_PREFIX

ROPE_SWAPS = GlobalSwaps()
_NOT_DEFINED = "not defined by this transformers version"


def rope_patched_modules() -> dict[str, int]:
    """The modeling modules whose rotary functions are swapped now, with their holder counts."""
    return ROPE_SWAPS.holders()


def _rope_candidates(module: ModuleType) -> list[str]:
    """The module's rotary functions by name (apply_rotary*), defined or not in ROPE_FUNCTIONS."""
    return [n for n, v in vars(module).items() if n.startswith(ROPE_PREFIX) and callable(v)]


def _checked_swap(specs: tuple[tuple[str, str], ...], module: ModuleType) -> SwappedFunctions:
    """The drop-in of every function ``specs`` names that passes its check; why each other candidate is left alone."""
    functions: dict[str, tuple[Callable, Callable, str]] = {}
    refused: dict[str, str] = {}
    known = dict(specs)
    for name in dict.fromkeys([*known, *_rope_candidates(module)]):
        original = getattr(module, name, None)
        if not callable(original):
            refused[name] = _NOT_DEFINED
            continue
        if name not in known:
            refused[name] = "no liger convention is registered for it (ROPE_FUNCTIONS)"
            continue
        convention = ROPE_CONVENTIONS[known[name]]
        try:
            replacement = make_hf_rope(original, convention.adapter)
            check_rope(original, replacement, convention)
        except Skip as why:
            refused[name] = str(why)
            continue
        functions[name] = (original, replacement, known[name])
    return SwappedFunctions(functions, refused)


def patch_rope(model: nn.Module, architectures: frozenset[str], handle: LigerPatch) -> None:
    report = handle.report
    for module_name in modeling_modules(model):
        module: ModuleType = importlib.import_module(module_name)
        candidates = _rope_candidates(module)
        if not candidates:
            continue
        arch = arch_of(module_name)
        if arch not in architectures:
            why = f"architecture {arch!r} is not in the rotary allow-list"
            report.left_alone += [Replacement("rope", f"{module_name}.{name}", why) for name in candidates]
            continue
        specs = ROPE_FUNCTIONS.get(arch, DEFAULT_ROPE_FUNCTIONS)
        try:
            swap = ROPE_SWAPS.acquire(module_name, functools.partial(_checked_swap, specs))
        except Skip as why:
            report.left_alone += [Replacement("rope", f"{module_name}.{name}", str(why)) for name in candidates]
            report.warnings.append(_unrouted_message(arch, {f"{module_name}.{n}": str(why) for n in candidates}))
            continue
        if swap.functions:
            handle.on_remove(functools.partial(ROPE_SWAPS.release, module_name))
        for name, (_, _, convention) in swap.functions.items():
            detail = f"torch.ops.liger.rope({ROPE_CONVENTIONS[convention].options}), process-wide, "
            report.replaced.append(Replacement("rope", f"{module_name}.{name}", detail + f"{swap.holders} holder(s)"))
        report.left_alone += [Replacement("rope", f"{module_name}.{name}", why) for name, why in swap.refused.items()]
        unrouted = {f"{module_name}.{n}": why for n, why in swap.refused.items() if why != _NOT_DEFINED}
        if unrouted:
            report.warnings.append(_unrouted_message(arch, unrouted))
        uncalled = [n for n in swap.functions if not model_refers_to(model, sys.modules[module_name], n)]
        if uncalled:
            report.warnings.append(_uncalled_message(arch, module_name, uncalled))


def _unrouted_message(arch: str, why: dict[str, str]) -> str:
    reasons = "; ".join(f"{target}: {reason}" for target, reason in why.items())
    return (
        f"apply_liger_ops: the rotary of architecture {arch!r} is not (fully) routed through torch.ops.liger.rope, "
        f"the model runs the original there. Left alone: {reasons}"
    )


def _uncalled_message(arch: str, module_name: str, names: list[str]) -> str:
    return (
        f"apply_liger_ops: architecture {arch!r}: swapped {', '.join(names)} in {module_name}, but no code of the "
        "model's classes from that module refers to it by name, so the model will not run torch.ops.liger.rope there"
    )
