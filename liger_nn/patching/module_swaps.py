"""Per-model module swaps: every submodule a rule takes becomes that rule's drop-in, holding the
*same* Parameter objects (an optimizer built earlier keeps working; state_dict keys, dtypes and
devices are unchanged).  A module instance reachable under two names is swapped under the first."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import nn

from liger_nn.patching.checks import Skip
from liger_nn.patching.handle import LigerPatch
from liger_nn.patching.report import Replacement


@dataclass(frozen=True)
class ModuleRule:
    """How one op swaps modules (one ``swap_<op>.py`` each).

    kind: the patch kind (the report's ``Replacement.kind``, apply_liger_ops' keyword).
    drop_in: liger_nn's module class; modules already of it are passed over.
    is_candidate: whether a module is one this op would replace (a candidate not taken is reported).
    refusal: why a candidate cannot be swapped (the report's detail), or None if it can.
    build: the drop-in holding the candidate's Parameter objects.
    describe: the report's detail of a replacement.
    check: a numerical check against the candidate, run once per class; raises Skip."""

    kind: str
    drop_in: type[nn.Module]
    is_candidate: Callable[[nn.Module], bool]
    refusal: Callable[[nn.Module], str | None]
    build: Callable[[nn.Module], nn.Module]
    describe: Callable[[nn.Module], str]
    check: Callable[[nn.Module], None] | None = None


def exact_class_rule(kind: str, torch_class: type[nn.Module], drop_in: type[nn.Module],
                     build: Callable[[nn.Module], nn.Module]) -> ModuleRule:  # fmt: skip
    """The rule of a drop-in for one torch class: modules of exactly that class are swapped,
    its subclasses (whose forward may differ) are reported; no numerical check."""

    def is_candidate(module: nn.Module) -> bool:
        return isinstance(module, torch_class)

    def refusal(module: nn.Module) -> str | None:
        if type(module) is not torch_class:
            return f"{type(module).__qualname__} subclasses nn.{torch_class.__name__}"
        return None

    def describe(module: nn.Module) -> str:
        return f"nn.{module!r}"

    return ModuleRule(kind, drop_in, is_candidate, refusal, build, describe)


def set_submodule(root: nn.Module, qualname: str, new: nn.Module) -> None:
    parent_name, _, child = qualname.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


def _restore(root: nn.Module, qualname: str, original: nn.Module, replacement: nn.Module) -> None:
    """Put ``original`` back, with the parameters the replacement holds now."""
    for name, param in replacement.named_parameters(recurse=False):
        setattr(original, name, param)
    original.train(replacement.training)
    set_submodule(root, qualname, original)


def _refusal(rule: ModuleRule, module: nn.Module, checked: dict[tuple[str, type], str | None]) -> str | None:
    """Why ``rule`` leaves ``module`` alone (its refusal, or its class's failed check), or None."""
    reason = rule.refusal(module)
    if reason is not None or rule.check is None:
        return reason
    cls = type(module)
    if (rule.kind, cls) not in checked:
        try:
            rule.check(module)
            checked[rule.kind, cls] = None
        except Skip as why:
            checked[rule.kind, cls] = f"{cls.__qualname__}: {why}"
    return checked[rule.kind, cls]


def swap_modules(model: nn.Module, rules: Sequence[ModuleRule], handle: LigerPatch) -> None:
    """Swap every submodule the first rule that takes it as a candidate accepts; report the rest."""
    report = handle.report
    drop_ins = tuple(rule.drop_in for rule in rules)
    checked: dict[tuple[str, type], str | None] = {}  # (kind, class) -> why its check failed, or None
    swaps: list[tuple[str, nn.Module, nn.Module, Replacement]] = []
    for qualname, module in model.named_modules():
        if isinstance(module, drop_ins):
            continue
        rule = next((rule for rule in rules if rule.is_candidate(module)), None)
        if rule is None:
            continue
        reason = _refusal(rule, module, checked)
        if reason is not None:
            report.left_alone.append(Replacement(rule.kind, qualname, reason))
            continue
        swaps.append((qualname, module, rule.build(module), Replacement(rule.kind, qualname, rule.describe(module))))
    # Swap after the walk (named_modules must not see the tree change under it).
    for qualname, old, new, what in swaps:
        if qualname == "":
            report.left_alone.append(Replacement(what.kind, "", "the model itself cannot be swapped in place"))
            continue
        set_submodule(model, qualname, new)
        handle.on_remove(functools.partial(_restore, model, qualname, old, new))
        report.replaced.append(what)
