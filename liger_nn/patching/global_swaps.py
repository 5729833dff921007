"""Process-wide swaps of module globals (a modeling module's functions), reference-counted so
that several patched models share one swap and the originals come back with the last holder."""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from liger_nn.patching.checks import Skip


@dataclass
class SwappedFunctions:
    """A module's swapped functions: name -> (original, replacement, convention);
    and the candidates left alone, name -> why."""

    functions: dict[str, tuple[Callable, Callable, str]]
    refused: dict[str, str]
    holders: int = 0


class GlobalSwaps:
    """The live swaps of one patch kind, by module name."""

    def __init__(self) -> None:
        self._swaps: dict[str, SwappedFunctions] = {}
        self._lock = threading.Lock()

    def acquire(self, module_name: str, make: Callable[[ModuleType], SwappedFunctions]) -> SwappedFunctions:
        """Swap module_name's functions as ``make(module)`` decides (it checks and builds the
        replacements, under the lock), or join the existing swap.  Returns the swap (its
        ``functions`` empty when every candidate was left alone, and then nothing is held)."""
        with self._lock:
            module = sys.modules[module_name]
            swap = self._swaps.get(module_name)
            if swap is None:
                swap = make(module)
                if not swap.functions:
                    return swap
                for name, (_, replacement, _) in swap.functions.items():
                    setattr(module, name, replacement)
                self._swaps[module_name] = swap
            else:
                for name, (_, replacement, _) in swap.functions.items():
                    if getattr(module, name) is not replacement:
                        raise Skip(f"{module_name}.{name} was replaced by someone else after this library patched it")
            swap.holders += 1
            return swap

    def release(self, module_name: str) -> None:
        """Drop one holder; the last one puts the originals back (unless someone replaced them since)."""
        with self._lock:
            swap = self._swaps[module_name]
            swap.holders -= 1
            if swap.holders > 0:
                return
            del self._swaps[module_name]
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

    def holders(self) -> dict[str, int]:
        """The modules swapped now, with their holder counts."""
        with self._lock:
            return {name: swap.holders for name, swap in self._swaps.items()}
