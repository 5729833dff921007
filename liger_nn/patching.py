"""Swap this project's ops into a loaded model: ``apply_liger_ops(model)``.

What is replaced (each kind can be switched off):

* ``rope``: the module-level rotary functions (``apply_rotary_pos_emb``, and
  where an architecture has them ``apply_rotary_pos_emb_vision`` and
  ``apply_rotary_pos_emb_interleave``) of the transformers modeling modules
  the model's classes come from, for the architectures in
  ``ROPE_ARCHITECTURES``.  ``ROPE_FUNCTIONS`` names each function's
  convention (``ROPE_CONVENTIONS``: rotate_half, partial rotary, GPT-J pairs,
  GLM's, DeepSeek's interleave, packed vision tokens), i.e. which drop-in of
  ``liger_nn`` replaces it and with which options of the op.  The attention
  ``forward`` looks the name up in its module's globals on every call, so the
  swap is **process-wide for that architecture**: every model of the
  architecture in the process uses the op until the last handle that patched
  it is removed.  transformers offers no per-instance hook for these
  functions: its class-level patch mapping acts only while a model is
  created, and ``kernels.kernelize`` replaces the forward of the module
  object one architecture's models share (``liger_nn.hub`` offers the op to
  it).  With ``kernels`` installed, the decorated functions are such module
  objects; ``hub_function`` reads the function behind one.
* ``group_norm``: every submodule whose class is exactly ``torch.nn.GroupNorm``
  (subclasses are left alone) becomes a ``liger_nn.GroupNorm`` holding the
  *same* Parameter objects (an optimizer built earlier keeps working), so
  ``state_dict`` keys, dtypes and devices are unchanged.  Per model.
* ``group_norm_silu``: every diffusers ``ResnetBlock2D`` whose norms are
  GroupNorms and whose nonlinearity is SiLU runs each norm -> SiLU pair as
  one ``group_norm(..., activation="silu")`` call (``liger_nn.diffusers_blocks``:
  an instance ``forward``; norm2's pair only with the default time
  embedding).  Each distinct kind of block is checked against its class's
  forward first.  Per model.
* ``poly_norm``: every submodule whose class name contains ``PolyNorm`` and
  that has ``weight`` of shape (3,), a one-element ``bias`` and a float
  ``eps`` becomes a ``liger_nn.PolyNorm`` sharing those parameters.  Per model.

Before anything is swapped, each candidate is checked numerically against its
original on tiny float32 CPU inputs (each rotary function in its convention's
layouts, with random tables; each distinct PolyNorm class); a candidate that
disagrees is left alone and the report says why.  GroupNorm needs no check: the class is exact.

The returned ``LigerPatch`` reports what was replaced and what was left alone,
and undoes everything with ``remove()`` or on leaving a ``with`` block.  No
quiet zero: a rotary of an allowed architecture left alone, or a swapped one
that no code of the model's classes names (a static check of their bytecode,
no forward), raises a ``LigerPatchWarning`` beside the report line.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType

import torch
from torch import nn

from liger_nn import diffusers_blocks, hf_rotary
from liger_nn.group_norm import GroupNorm
from liger_nn.poly_norm import PolyNorm
from liger_nn.rope import apply_rotary_pos_emb as _liger_apply_rotary_pos_emb


@dataclass(frozen=True)
class RotaryConvention:
    """How one kind of transformers rotary function maps onto torch.ops.liger.rope.

    adapter: the liger function with that kind's math (liger_nn/rope.py,
    liger_nn/hf_rotary.py).  options: the op's options, for the report.
    partial: the original itself rotates only R = cos.shape[-1] < head_dim
    dims, so the patch-time check covers narrow tables too.  packed: (T, H, D)
    tokens with (T, R) tables and no unsqueeze_dim."""

    adapter: Callable
    options: str
    partial: bool = False
    packed: bool = False


ROPE_CONVENTIONS: dict[str, RotaryConvention] = {
    "halves": RotaryConvention(_liger_apply_rotary_pos_emb, "pairs='halves'"),
    "partial": RotaryConvention(_liger_apply_rotary_pos_emb, "pairs='halves', partial rotary", partial=True),
    "interleaved": RotaryConvention(hf_rotary.apply_rotary_pos_emb_interleaved, "pairs='interleaved'"),
    "glm": RotaryConvention(
        hf_rotary.apply_rotary_pos_emb_glm,
        "pairs='interleaved', partial rotary, tables' first half repeat-interleaved",
        partial=True,
    ),
    "interleaved_to_halves": RotaryConvention(
        hf_rotary.apply_rotary_pos_emb_interleave, "pairs='interleaved_to_halves'"
    ),
    "vision": RotaryConvention(
        hf_rotary.apply_rotary_pos_emb_vision, "packed tokens (T, H, D), pairs='halves'", packed=True
    ),
}

_LLAMA = (("apply_rotary_pos_emb", "halves"),)
_PARTIAL = (("apply_rotary_pos_emb", "partial"),)
_QWEN_VL = (("apply_rotary_pos_emb", "halves"), ("apply_rotary_pos_emb_vision", "vision"))

# transformers model types (the ``models/<name>/modeling_<name>.py`` modules)
# -> the module-level rotary functions their attention calls, each with its
# convention; the patch-time check confirms each against the installed
# version before swapping.  Read from transformers 5.17's modeling files:
ROPE_FUNCTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    # HF's rotate_half formula over all of head_dim.
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "mixtral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen2_moe": _LLAMA,
    "qwen3": _LLAMA,
    "qwen3_moe": _LLAMA,
    "gemma": _LLAMA,
    "gemma2": _LLAMA,
    "granite": _LLAMA,
    "olmo2": _LLAMA,  # casts the result back to q's dtype, as the op does anyway
    # Partial rotary done by the attention (slice, rotate, cat): the function sees the rotary dims only.
    "phi": _LLAMA,
    "stablelm": _LLAMA,
    # Partial rotary done by the function: dims cos.shape[-1]..head_dim pass through.
    "phi3": _PARTIAL,
    "gpt_neox": _PARTIAL,
    "qwen3_next": _PARTIAL,
    # GPT-J pairs: Cohere with interleaved tables, GLM-4 with halves tables (and partial rotary).
    "cohere": (("apply_rotary_pos_emb", "interleaved"),),
    "glm4": (("apply_rotary_pos_emb", "glm"),),
    # The text model composes M-RoPE's sections into gathered (B, S, R) tables
    # (Qwen2VLRotaryEmbedding) before the attention's rotate_half; the vision
    # tower rotates packed tokens.
    "qwen2_vl": _QWEN_VL,
    "qwen2_5_vl": _QWEN_VL,
    # MLA: the function used depends on config.rope_interleave.
    "deepseek_v3": (("apply_rotary_pos_emb", "halves"), ("apply_rotary_pos_emb_interleave", "interleaved_to_halves")),
}
# The default allow-list.  An architecture added to it that ROPE_FUNCTIONS
# does not know gets Llama's apply_rotary_pos_emb treatment (still checked).
ROPE_ARCHITECTURES: tuple[str, ...] = tuple(ROPE_FUNCTIONS)

# The versions the patch is tested with: 5.17.0 in CI and on the CUDA machine, the range's ends
# (4.57.1, 5.25.0) by `nox -s transformers`.  On 4.57.1 DeepSeek-V3's interleaved rotary is
# another function and is left alone; the Qwen-VL models are tested on 5.x only.  5.25.0 brings
# the `kernels` package, whose hub decorators make most rotary functions module objects
# (hub_function unwraps them).
TESTED_TRANSFORMERS_VERSIONS: tuple[str, ...] = ("4.57.1", "5.17.0", "5.25.0")

_ROPE_PREFIX = "apply_rotary"  # the names of the rotary functions in modeling modules
_MODELS_PREFIX = "transformers.models."
# Float32 agreement the patch-time checks demand (fp32 kernel vs fp32 torch).
_CHECK_RTOL = 1e-4


@dataclass(frozen=True)
class Replacement:
    """One thing the patch looked at.

    kind: "rope", "group_norm", "group_norm_silu" or "poly_norm".  target: the qualified submodule
    name in the model ("" for the root), or for rope the rotary function's
    qualified name (``transformers.models.<arch>.modeling_<arch>.<function>``).
    detail: what it was, or why it was left alone."""

    kind: str
    target: str
    detail: str


class LigerPatchWarning(UserWarning):
    """apply_liger_ops left (part of) the rotary of an architecture of its table on
    the original code, or swapped a rotary function that no code of the model refers to."""


@dataclass
class PatchReport:
    replaced: list[Replacement] = field(default_factory=list)
    left_alone: list[Replacement] = field(default_factory=list)
    # The messages apply_liger_ops also raised as LigerPatchWarning.
    warnings: list[str] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(r.kind == kind for r in self.replaced)

    @property
    def rope_functions(self) -> list[str]:
        """The rotary functions swapped for the op (qualified names)."""
        return [r.target for r in self.replaced if r.kind == "rope"]

    @property
    def rope_modules(self) -> list[str]:
        """The transformers modeling modules with at least one rotary function swapped."""
        return list(dict.fromkeys(name.rpartition(".")[0] for name in self.rope_functions))

    def __str__(self) -> str:
        lines = [f"replaced {len(self.replaced)}:"]
        lines += [f"  {r.kind:10s} {r.target or '<root>'}: {r.detail}" for r in self.replaced]
        lines.append(f"left alone {len(self.left_alone)}:")
        lines += [f"  {r.kind:10s} {r.target or '<root>'}: {r.detail}" for r in self.left_alone]
        if self.warnings:
            lines.append(f"warnings {len(self.warnings)}:")
            lines += [f"  {w}" for w in self.warnings]
        return "\n".join(lines)


# ---------------------------------------------------------------------------
# rope: process-wide swap of a modeling module's rotary functions,
# reference-counted so that several patched models share one swap.


@dataclass
class _RopeSwap:
    """A modeling module's swapped functions: name -> (original, replacement,
    convention); and the candidates left alone, name -> why."""

    functions: dict[str, tuple[Callable, Callable, str]]
    refused: dict[str, str]
    holders: int = 0


_ROPE_SWAPS: dict[str, _RopeSwap] = {}
_NOT_DEFINED = "not defined by this transformers version"
_ROPE_LOCK = threading.Lock()


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


def _rotary_signature(original: Callable) -> inspect.Signature:
    """The parameters ``original`` takes: a kernels function layer's are those of its ``forward`` less ``self``."""
    if isinstance(original, nn.Module) and hasattr(type(original), "kernel_layer_name"):
        signature = inspect.signature(type(original).forward)
        return signature.replace(parameters=list(signature.parameters.values())[1:])
    return inspect.signature(original)


def _make_hf_rope(original: Callable, adapter: Callable) -> Callable:
    """A function with the original's parameters that calls ``adapter``
    (which takes q, k, cos, sin[, unsqueeze_dim=...]).  Accepted: transformers
    5.x's (q, k, cos, sin, unsqueeze_dim=1), 4.x's (q, k, cos, sin,
    position_ids=None, unsqueeze_dim=1) and the vision form (q, k, cos, sin),
    as plain functions or as ``kernels`` function layers (``hub_function``)."""
    signature = _rotary_signature(original)
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
        raise _Skip(f"unknown signature {signature}")
    wrapped = hub_function(original) or original
    functools.update_wrapper(liger_rope, wrapped, updated=() if isinstance(wrapped, nn.Module) else ("__dict__",))
    del liger_rope.__wrapped__  # not a wrapper: inspect/dynamo must not look through it
    liger_rope.__liger_original__ = original
    return liger_rope


class _Skip(Exception):
    """A candidate left alone; the message says why."""


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach().double(), b.detach().double()
    if a.shape != b.shape or not torch.isfinite(a).all() or not torch.isfinite(b).all():
        return False
    return bool((a - b).norm() <= _CHECK_RTOL * b.norm())


def _rope_check_cases(convention: RotaryConvention) -> list[tuple[tuple, dict]]:
    """Tiny float32 CPU inputs: (B, H, S, D) q and k with (B, S, R) tables, and
    (B, S, H, D) with unsqueeze_dim=2; or (T, H, D) with (T, R) for packed
    tokens.  R = D, and R < D too for partial conventions.  Random tables
    (not cos/sin of angles): each table entry must be used where the original
    uses it.  D = 10: a head_dim that is no power of two."""
    gen = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=gen)
    head_dim = 10
    widths = (head_dim, 4) if convention.partial else (head_dim,)
    cases: list[tuple[tuple, dict]] = []
    for rot in widths:
        if convention.packed:
            cases.append(((rand(6, 3, head_dim), rand(6, 1, head_dim), rand(6, rot), rand(6, rot)), {}))
            continue
        q, k, cos, sin = rand(2, 3, 3, head_dim), rand(2, 1, 3, head_dim), rand(2, 3, rot), rand(2, 3, rot)
        cases.append(((q, k, cos, sin), {}))
        cases.append(((q.transpose(1, 2), k.transpose(1, 2), cos, sin), {"unsqueeze_dim": 2}))
    return cases


def _check_rope(original: Callable, replacement: Callable, convention: RotaryConvention) -> None:
    for args, kwargs in _rope_check_cases(convention):
        try:
            expected = original(*args, **kwargs)
            got = replacement(*args, **kwargs)
        except Exception as exc:  # the original may not support a layout; that is a mismatch too
            raise _Skip(f"patch-time check raised {type(exc).__name__}: {exc}") from None
        if not all(_close(g, e) for g, e in zip(got, expected, strict=True)):
            raise _Skip("patch-time check: the op's output differs from the original function's")


def _rope_candidates(module: ModuleType) -> list[str]:
    """The module's rotary functions by name (apply_rotary*), defined or not in ROPE_FUNCTIONS."""
    return [n for n, v in vars(module).items() if n.startswith(_ROPE_PREFIX) and callable(v)]


def _swap_rope(module: ModuleType, specs: tuple[tuple[str, str], ...]) -> _RopeSwap:
    """Check and make every swap ``specs`` names (the caller holds the lock)."""
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
            replacement = _make_hf_rope(original, convention.adapter)
            _check_rope(original, replacement, convention)
        except _Skip as why:
            refused[name] = str(why)
            continue
        functions[name] = (original, replacement, known[name])
    for name, (_, replacement, _) in functions.items():
        setattr(module, name, replacement)
    return _RopeSwap(functions, refused)


def _acquire_rope(module_name: str, specs: tuple[tuple[str, str], ...]) -> _RopeSwap:
    """Swap module_name's rotary functions (or join an existing swap).  Returns
    the swap (its ``functions`` empty when every candidate was left alone, and
    then nothing is held)."""
    with _ROPE_LOCK:
        module = sys.modules[module_name]
        swap = _ROPE_SWAPS.get(module_name)
        if swap is None:
            swap = _swap_rope(module, specs)
            if not swap.functions:
                return swap
            _ROPE_SWAPS[module_name] = swap
        else:
            for name, (_, replacement, _) in swap.functions.items():
                if getattr(module, name) is not replacement:
                    raise _Skip(f"{module_name}.{name} was replaced by someone else after this library patched it")
        swap.holders += 1
        return swap


def _release_rope(module_name: str) -> None:
    with _ROPE_LOCK:
        swap = _ROPE_SWAPS[module_name]
        swap.holders -= 1
        if swap.holders > 0:
            return
        del _ROPE_SWAPS[module_name]
        module = sys.modules[module_name]
        for name, (original, replacement, _) in swap.functions.items():
            if getattr(module, name) is replacement:
                setattr(module, name, original)
            else:
                warnings.warn(
                    f"{module_name}.{name} was replaced by someone else after liger_nn patched it; "
                    "leaving their function in place",
                    stacklevel=3,
                )


def rope_patched_modules() -> dict[str, int]:
    """The modeling modules whose rotary functions are swapped now, with their holder counts."""
    with _ROPE_LOCK:
        return {name: swap.holders for name, swap in _ROPE_SWAPS.items()}


def _modeling_modules(model: nn.Module) -> list[str]:
    """The transformers modeling modules that define the model's classes, in first-seen order."""
    seen: dict[str, None] = {}
    for module in model.modules():
        name = type(module).__module__
        if name.startswith(_MODELS_PREFIX) and name.rsplit(".", 1)[-1].startswith("modeling_"):
            seen.setdefault(name, None)
    return list(seen)


def _arch_of(module_name: str) -> str:
    # transformers.models.<arch>.modeling_<arch>
    return module_name[len(_MODELS_PREFIX) :].split(".", 1)[0]


# ---------------------------------------------------------------------------
# Module swaps (per model).


def _set_submodule(root: nn.Module, qualname: str, new: nn.Module) -> None:
    parent_name, _, child = qualname.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


def _liger_group_norm(old: nn.GroupNorm) -> GroupNorm:
    new = GroupNorm(old.num_groups, old.num_channels, old.eps, old.affine, device="meta", bias=old.bias is not None)
    # Hand over the Parameter objects themselves (None stays None).
    new.weight = old.weight
    new.bias = old.bias
    new.train(old.training)
    return new


def _is_poly_norm(module: nn.Module) -> bool:
    weight, bias, eps = (getattr(module, name, None) for name in ("weight", "bias", "eps"))
    return (
        "PolyNorm" in type(module).__name__
        and isinstance(weight, torch.Tensor)
        and tuple(weight.shape) == (3,)
        and isinstance(bias, torch.Tensor)
        and bias.numel() == 1
        and bias.dim() <= 1
        and isinstance(eps, float)
    )


def _liger_poly_norm(old: nn.Module) -> PolyNorm:
    new = PolyNorm(eps=old.eps)
    new.weight = old.weight
    new.bias = old.bias
    new.train(old.training)
    return new


def _check_poly_norm(old: nn.Module) -> None:
    """The original class and liger's PolyNorm agree on a float32 CPU input."""
    ref = copy.deepcopy(old).to("cpu", torch.float32)
    new = _liger_poly_norm(ref)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        try:
            expected = ref(x)
        except Exception as exc:
            raise _Skip(f"patch-time check raised {type(exc).__name__}: {exc}") from None
        if not _close(new(x), expected):
            raise _Skip("patch-time check: liger PolyNorm's output differs from this class's")


@dataclass
class _ModuleSwap:
    qualname: str
    original: nn.Module
    replacement: nn.Module


class LigerPatch:
    """The handle apply_liger_ops returns: ``report``, ``remove()``, and a
    context manager that removes the patch on exit."""

    def __init__(self, model: nn.Module, report: PatchReport) -> None:
        self.model = model
        self.report = report
        self._module_swaps: list[_ModuleSwap] = []
        self._fused_blocks: list[nn.Module] = []
        self._rope_modules: list[str] = []
        self._active = True

    @property
    def active(self) -> bool:
        return self._active

    def remove(self) -> None:
        """Put the original modules back (with the parameters the replacements
        hold now) and release this patch's share of the rotary swaps.  Idempotent."""
        if not self._active:
            return
        self._active = False
        for block in self._fused_blocks:
            diffusers_blocks.unfuse(block)
        for swap in reversed(self._module_swaps):
            for name, param in swap.replacement.named_parameters(recurse=False):
                setattr(swap.original, name, param)
            swap.original.train(swap.replacement.training)
            _set_submodule(self.model, swap.qualname, swap.original)
        for module_name in self._rope_modules:
            _release_rope(module_name)

    def __enter__(self) -> LigerPatch:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "active" if self._active else "removed"
        return f"LigerPatch({state}, {len(self.report.replaced)} replaced, {len(self.report.left_alone)} left alone)"


def apply_liger_ops(
    model: nn.Module,
    *,
    rope: bool = True,
    group_norm: bool = True,
    poly_norm: bool = True,
    rope_architectures: Iterable[str] = ROPE_ARCHITECTURES,
    group_norm_silu: bool = True,
) -> LigerPatch:
    """Swap torch.ops.liger into ``model`` (see the module docstring for what and
    how).  Returns a LigerPatch whose ``report`` lists each replacement and each
    candidate left alone; ``remove()`` (or ``with apply_liger_ops(m):``) undoes it.

    Patch before ``torch.compile`` and before wrapping the model (DDP/FSDP):
    module swaps change the module tree.  The rotary swap covers every model of
    a patched architecture in the process (including copies made later)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"apply_liger_ops expects an nn.Module, got {type(model).__name__}")
    report = PatchReport()
    handle = LigerPatch(model, report)
    rope_architectures = frozenset(rope_architectures)
    try:
        if rope:
            _patch_rope(model, rope_architectures, handle)
        if group_norm or poly_norm:
            _patch_modules(model, group_norm, poly_norm, handle)
        if group_norm_silu:
            _fuse_resnet_blocks(model, handle)
    except BaseException:
        handle.remove()
        raise
    for message in report.warnings:
        warnings.warn(message, LigerPatchWarning, stacklevel=2)
    return handle


def _patch_rope(model: nn.Module, architectures: frozenset[str], handle: LigerPatch) -> None:
    report = handle.report
    for module_name in _modeling_modules(model):
        module: ModuleType = importlib.import_module(module_name)
        candidates = _rope_candidates(module)
        if not candidates:
            continue
        arch = _arch_of(module_name)
        if arch not in architectures:
            why = f"architecture {arch!r} is not in the rotary allow-list"
            report.left_alone += [Replacement("rope", f"{module_name}.{name}", why) for name in candidates]
            continue
        try:
            swap = _acquire_rope(module_name, ROPE_FUNCTIONS.get(arch, _LLAMA))
        except _Skip as why:
            report.left_alone += [Replacement("rope", f"{module_name}.{name}", str(why)) for name in candidates]
            report.warnings.append(_unrouted_message(arch, {f"{module_name}.{n}": str(why) for n in candidates}))
            continue
        for name, (_, _, convention) in swap.functions.items():
            detail = f"torch.ops.liger.rope({ROPE_CONVENTIONS[convention].options}), process-wide, "
            report.replaced.append(Replacement("rope", f"{module_name}.{name}", detail + f"{swap.holders} holder(s)"))
        report.left_alone += [Replacement("rope", f"{module_name}.{name}", why) for name, why in swap.refused.items()]
        unrouted = {f"{module_name}.{n}": why for n, why in swap.refused.items() if why != _NOT_DEFINED}
        if unrouted:
            report.warnings.append(_unrouted_message(arch, unrouted))
        uncalled = [n for n in swap.functions if not _model_refers_to(model, sys.modules[module_name], n)]
        if uncalled:
            report.warnings.append(_uncalled_message(arch, module_name, uncalled))
        if swap.functions:
            handle._rope_modules.append(module_name)


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


def _code_refers_to(code: types.CodeType, name: str) -> bool:
    return name in code.co_names or any(
        isinstance(c, types.CodeType) and _code_refers_to(c, name) for c in code.co_consts
    )


def _model_refers_to(model: nn.Module, module: ModuleType, name: str) -> bool:
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


def _patch_modules(model: nn.Module, group_norm: bool, poly_norm: bool, handle: LigerPatch) -> None:
    report = handle.report
    checked_poly_classes: dict[type, str | None] = {}  # class -> reason it failed the check, or None
    swaps: list[tuple[str, nn.Module, nn.Module, Replacement]] = []
    for qualname, module in model.named_modules():
        if isinstance(module, (GroupNorm, PolyNorm)):
            continue
        if group_norm and isinstance(module, nn.GroupNorm):
            if type(module) is not nn.GroupNorm:
                report.left_alone.append(
                    Replacement("group_norm", qualname, f"{type(module).__qualname__} subclasses nn.GroupNorm")
                )
                continue
            new = _liger_group_norm(module)
            swaps.append((qualname, module, new, Replacement("group_norm", qualname, f"nn.{module!r}")))
        elif poly_norm and "PolyNorm" in type(module).__name__:
            cls = type(module)
            if not _is_poly_norm(module):
                reason = "no weight (3,), one-element bias and float eps"
            else:
                if cls not in checked_poly_classes:
                    try:
                        _check_poly_norm(module)
                        checked_poly_classes[cls] = None
                    except _Skip as why:
                        checked_poly_classes[cls] = str(why)
                reason = checked_poly_classes[cls]
            if reason is not None:
                report.left_alone.append(Replacement("poly_norm", qualname, f"{cls.__qualname__}: {reason}"))
                continue
            new = _liger_poly_norm(module)
            swaps.append((qualname, module, new, Replacement("poly_norm", qualname, f"{cls.__qualname__}")))
    # Swap after the walk (named_modules must not see the tree change under it).
    for qualname, old, new, what in swaps:
        if qualname == "":
            report.left_alone.append(Replacement(what.kind, "", "the model itself cannot be swapped in place"))
            continue
        _set_submodule(model, qualname, new)
        handle._module_swaps.append(_ModuleSwap(qualname, old, new))
        report.replaced.append(what)


def _fuse_resnet_blocks(model: nn.Module, handle: LigerPatch) -> None:
    report = handle.report
    checked: dict[tuple, str | None] = {}  # kind of block -> why its check failed, or None
    for qualname, module in model.named_modules():
        if not diffusers_blocks.is_resnet_block(module) or module in handle._fused_blocks:
            continue
        reason = diffusers_blocks.unfusable_reason(module)
        if reason is None:
            kind = diffusers_blocks.kind(module)
            if kind not in checked:
                checked[kind] = diffusers_blocks.check(module, _close)
            reason = checked[kind]
        if reason is not None:
            report.left_alone.append(Replacement("group_norm_silu", qualname, f"ResnetBlock2D: {reason}"))
            continue
        diffusers_blocks.fuse(module)
        handle._fused_blocks.append(module)
        pairs = " and ".join(f"{name} -> SiLU" for name in diffusers_blocks.fused_pairs(module))
        report.replaced.append(Replacement("group_norm_silu", qualname, f"ResnetBlock2D: {pairs} fused"))
