"""What a bad call raises under torch.compile(fullgraph=True) (docs/ops.md, "Errors under torch.compile").

Eagerly every op raises TypeError/ValueError.  Under torch.compile the same
check runs in the fake kernel while Dynamo traces, and Dynamo turns any
exception there into ``torch._dynamo.exc.TorchRuntimeError`` (a
RuntimeError).  There is no supported switch to get the original type back
(torch/_dynamo/utils.py: run_node wraps it in a RuntimeError, get_fake_value
re-raises a TorchRuntimeError ``from None``).  These tests pin what users get,
so that a torch upgrade changing it fails here and the docs get updated.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch._dynamo.exc import TorchRuntimeError

from tests.helpers import DEVICE


def _x(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, device=DEVICE)


def _ids(*shape, dtype=torch.int64):
    return torch.zeros(*shape, dtype=dtype, device=DEVICE)


# (op, arguments, keyword arguments, the exception raised eagerly): one bad input per op.
CASES = {
    "poly_norm": (torch.ops.liger.poly_norm, lambda: (_x(2, 4), _x(4), _x(1)), {}, ValueError),
    "poly_norm_backward": (
        torch.ops.liger.poly_norm_backward,
        lambda: (_x(2, 4), _x(2, 4, dtype=torch.float32).int(), _x(3), 1e-6),
        {},
        TypeError,
    ),
    "group_norm": (torch.ops.liger.group_norm, lambda: (_x(2, 6, 3), 4), {}, ValueError),
    "group_norm_backward": (
        torch.ops.liger.group_norm_backward,
        lambda: (_x(2, 6, 4), _x(2, 6, 3), 3, None, None, 1e-5),
        {},
        ValueError,
    ),
    "rope": (torch.ops.liger.rope, lambda: (_x(1, 2, 3, 8), _x(1, 2, 3, 8), _x(3, 3), _x(3, 3)), {}, ValueError),
    "rope_backward": (
        torch.ops.liger.rope_backward,
        lambda: (_x(1, 2, 3, 8), None, _x(5, 8), _x(5, 8), _ids(3, dtype=torch.float32)),
        {},
        TypeError,
    ),
    "rope_": (
        torch.ops.liger.rope_,
        lambda: (_x(1, 2, 3, 8), None, _x(3, 8), _x(3, 8)),
        {"pairs": "rotate_half"},
        ValueError,
    ),
    "cross_entropy": (torch.ops.liger.cross_entropy, lambda: (_x(4, 9), _ids(5)), {}, ValueError),
    "cross_entropy_backward": (
        torch.ops.liger.cross_entropy_backward,
        lambda: (_x(4), _x(4, 9), _ids(4), _x(4), None, -100, 0.0, "mean", 0.0, None),
        {},
        ValueError,
    ),
    "fused_linear_cross_entropy": (
        torch.ops.liger.fused_linear_cross_entropy,
        lambda: (_x(4, 8), _x(9, 7), _ids(4)),
        {},
        ValueError,
    ),
    "fused_linear_cross_entropy_backward": (
        torch.ops.liger.fused_linear_cross_entropy_backward,
        lambda: (_x(1)[0], _x(4, 8), _x(9, 8), _ids(4), _x(4), None, None, -100, 0.0, "sum", 0.0, None, [True, True]),
        {},
        ValueError,
    ),
}


def _sizes_masked(message: str) -> str:
    """message with every size (a number, or a symbol like s27 under dynamic shapes) as N."""
    return re.sub(r"\b(s\d+|\d+)\b", "N", message)


def _original(err: BaseException) -> BaseException | None:
    """The first TypeError or ValueError down err's chain of causes and contexts."""
    seen: set[int] = set()
    node: BaseException | None = err
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        if type(node) in (TypeError, ValueError):
            return node
        node = node.__cause__ or node.__context__
    return None


def _eager_error(op, args, kwargs, expected):
    with pytest.raises(expected) as info:
        op(*args, **kwargs)
    return info.value


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_under_compile_fullgraph_is_a_torch_runtime_error_chained_to_the_original(name, dynamic):
    op, make_args, kwargs, expected = CASES[name]
    args = make_args()
    eager = _eager_error(op, args, kwargs, expected)

    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: op(*a, **kwargs), fullgraph=True, dynamic=dynamic)
    with pytest.raises(TorchRuntimeError) as info:
        compiled(*args)
    err = info.value
    assert type(err) is TorchRuntimeError and isinstance(err, RuntimeError)
    assert not isinstance(err, (TypeError, ValueError))
    # Raised `from None`: no __cause__; the original is further down the chain of exceptions it was raised
    # while handling (torch 2.13: err.__context__.__cause__; 2.14 adds two layers of Dynamo's own).
    assert err.__cause__ is None and err.__suppress_context__
    original = _original(err)
    assert type(original) is expected
    # The check ran on fake tensors: with dynamic shapes a size may read as a symbol (s27) instead of its value.
    if dynamic:
        assert _sizes_masked(str(original)) == _sizes_masked(str(eager))
    else:
        assert str(original) == str(eager)
    assert repr(original) in str(err), "the compile error's text quotes the op's exception"
