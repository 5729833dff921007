"""What apply_liger_ops tells its caller: each replacement, each candidate left alone, the warnings."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Replacement:
    """One thing the patch looked at.

    kind: the patch kind ("rope", "group_norm", "group_norm_silu", "poly_norm", ...).  target: the
    qualified submodule name in the model ("" for the root), or for rope the rotary function's
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
