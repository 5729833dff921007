"""``help(torch.ops.liger.<op>)``: each op's docstring, built from its schema
and its registration module's docstring.

torch.library.define takes no docstring, and help() on an op shows the
generic OpOverloadPacket text.  pydoc (help()) and IPython's ``?`` show an
object's own ``__doc__`` instead, which both an op's OpOverloadPacket
(``torch.ops.liger.rope``) and its OpOverload (``torch.ops.liger.rope.default``)
accept.  ``attach`` sets it on every op in the namespace, from what each op
already has:

* its schema;
* its section of the docstring of the registration module that defines it
  (shapes, dtypes, gradients): the lines from the one that starts with
  ``<op>(`` to the next unindented line;
* where docs/ops.md describes it: the section whose code block declares
  ``liger::<op>(``.

A new op gets all of it by being defined at module level in a
``registrations/<module>.py`` whose docstring has its section, as every op
module's does.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import ModuleType

import torch

from registrations._library import LIB

NAMESPACE = "liger"
OPS_DOC = Path(__file__).resolve().parent.parent / "docs" / "ops.md"  # present in a source tree


def defining_modules() -> dict[str, ModuleType]:
    """op name -> the ``registrations.<module>`` that defines it: of the
    modules holding its OpOverload at module level (rule modules such as
    ``functorch`` hold the ops they extend too), the one whose docstring has
    the op's section, else the first."""
    holders: dict[str, list[ModuleType]] = {}
    for name, module in sorted(sys.modules.items()):
        if not name.startswith(__package__ + ".") or name.rsplit(".", 1)[1].startswith("_") or module is None:
            continue
        for value in vars(module).values():
            if isinstance(value, torch._ops.OpOverload) and value._schema.name.startswith(NAMESPACE + "::"):
                if module not in holders.setdefault(value._opname, []):
                    holders[value._opname].append(module)
    return {op: next((m for m in ms if section(m.__doc__, op)), ms[0]) for op, ms in holders.items()}


def op_names() -> list[str]:
    """Every op defined in the namespace so far."""
    defined = getattr(LIB, "_op_defs", None)  # torch.library keeps the qualified names it defined
    names = {n.split("::", 1)[1] for n in defined} if defined is not None else set()
    return sorted(names | set(defining_modules()))


def section(docstring: str | None, op: str) -> str:
    """The lines of ``docstring`` describing ``op``: from the line starting
    ``<op>(`` up to the next unindented line; "" if there is none."""
    lines = (docstring or "").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(op + "(")), None)
    if start is None:
        return ""
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end][0].isspace()):
        end += 1
    return "\n".join(lines[start:end]).rstrip()


def _summary(docstring: str | None) -> str:
    return " ".join((docstring or "").strip().split("\n\n", 1)[0].split())


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def docs_location(op: str) -> str:
    """``docs/ops.md#<section>`` for the section declaring ``liger::<op>(``,
    with the file's path when this is a source tree; plain docs/ops.md if
    the section is not found (an installed wheel has no docs/)."""
    if OPS_DOC.is_file():
        heading = None
        for line in OPS_DOC.read_text(encoding="utf-8").splitlines():
            if line.startswith("## "):
                heading = line[3:]
            elif f"{NAMESPACE}::{op}(" in line and heading is not None:
                return f"docs/ops.md#{_anchor(heading)} ({OPS_DOC})"
        return f"docs/ops.md ({OPS_DOC})"
    return "docs/ops.md in the csrc-free-ops source tree"


def op_doc(op: str, module: ModuleType | None) -> str:
    """The docstring of ``torch.ops.liger.<op>``."""
    packet = getattr(getattr(torch.ops, NAMESPACE), op)
    schemas = "\n".join(f"    {getattr(packet, name)._schema}" for name in packet.overloads())
    parts = [f"torch.ops.{NAMESPACE}.{op}: a PyTorch custom op (torch.library).\n\nSchema:\n{schemas}"]
    if module is not None:
        described = section(module.__doc__, op)
        if described:
            parts.append(described)
        parts.append(f"Defined in {module.__name__}: {_summary(module.__doc__)}")
    parts.append(f"Shapes, dtypes, devices, gradients and errors: {docs_location(op)}")
    return "\n\n".join(parts) + "\n"


def attach() -> None:
    """Set ``__doc__`` on every op of the namespace, packet and overloads."""
    modules = defining_modules()
    for op in op_names():
        doc = op_doc(op, modules.get(op))
        packet = getattr(getattr(torch.ops, NAMESPACE), op)
        packet.__doc__ = doc
        for name in packet.overloads():
            getattr(packet, name).__doc__ = doc
