"""RMSNorm's scalar options, one value from the registration down to the launch.

* ``eps``: added to mean(x^2) before the reciprocal square root;
* ``offset``: the weight's offset, y = norm(x) * (offset + weight)
  (Gemma's ``1 + weight``: offset 1.0);
* ``casting_mode``: "llama" (LlamaRMSNorm, Qwen3's q/k norms): norm(x) in
  float32, rounded to x's dtype, then times the weight; "gemma"
  (GemmaRMSNorm, OLMo2's norms): all in float32, y rounded once.
"""

from __future__ import annotations

from typing import NamedTuple

CASTING_MODES = ("llama", "gemma")


class Options(NamedTuple):
    eps: float = 1e-6
    offset: float = 0.0
    casting_mode: str = "llama"

    @property
    def round_normed(self) -> bool:
        """Whether norm(x) is rounded to x's dtype before the weight multiplies it."""
        return self.casting_mode == "llama"
