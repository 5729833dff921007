"""The graphs AOTAutograd traces for the liger ops on CUDA tensors, checked
without a GPU: fake CUDA tensors, the real (compiled, not interpreted) Triton
kernels.  ``python -m tests.decomposition_check`` prints, per case, the
liger ops left in the traced graph and the triton_kernel_wrapper nodes in it,
as JSON; tests/test_decomposition.py runs it in a fresh process (the
interpreter's kernels, which the rest of the CPU suite runs, are no
JITFunctions and cannot be wrapped)."""

from __future__ import annotations

import json
import logging
import os

os.environ.setdefault("CSRC_FREE_OPS_NUM_SMS", "132")

import torch  # noqa: E402
from torch._functorch.aot_autograd import aot_function  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import csrc_free_ops  # noqa: E402, F401
from csrc_free_ops.group_norm import launch as group_norm_launch  # noqa: E402
from csrc_free_ops.group_norm.residency import CudaDevice  # noqa: E402
from registrations import _library  # noqa: E402

# Without a GPU: no device properties (no one-pass group_norm plans), and Triton has no driver to
# analyse which tensors a kernel writes (torch then assumes all, and says so at WARNING).
group_norm_launch._cuda_device = lambda dev, sms: CudaDevice(sms)
logging.getLogger("torch._higher_order_ops.triton_kernel_wrap").disabled = True


class _Traced(Exception):
    pass


def _every_op(x, w, b, q, k, cos, sin, pw, pb, h):
    y = torch.ops.liger.group_norm(x, 4, w, b, 1e-5)
    y_plain = torch.ops.liger.group_norm(x, 4, None, None, 1e-5)
    z = torch.ops.liger.poly_norm(h, pw, pb, 1e-6)
    qo, ko = torch.ops.liger.rope(q, k, cos, sin)
    q_alone, _ = torch.ops.liger.rope(q, None, cos, sin)
    grads = (
        *torch.ops.liger.group_norm_backward(y, x, 4, w, b, 1e-5),
        torch.ops.liger.group_norm_backward(y, x, 4, None, None, 1e-5)[0],
        *torch.ops.liger.poly_norm_backward(z, h, pw, 1e-6),
        *torch.ops.liger.rope_backward(qo, ko, cos, sin),
    )
    return (y_plain, z, q_alone, *grads)


def _inputs() -> tuple:
    dev, bf16 = "cuda", torch.bfloat16
    return (
        torch.randn(2, 8, 4, 4, device=dev, dtype=bf16), torch.randn(8, device=dev), torch.randn(8, device=dev),
        torch.randn(1, 4, 16, 64, device=dev, dtype=bf16), torch.randn(1, 2, 16, 64, device=dev, dtype=bf16),
        torch.randn(16, 64, device=dev), torch.randn(16, 64, device=dev),
        torch.randn(3, device=dev), torch.randn(1, device=dev), torch.randn(4, 64, device=dev, dtype=bf16),
    )  # fmt: skip


def _larger_and_options(x, w, b, h, pw, q, k, cos, sin, ids, cu, qp, kp):
    """Multi-launch plans (a large group_norm, a many-program poly_norm backward) and rope's
    options: position_ids on HF's transposed views, k alone, packed tokens with cu_seqlens,
    interleaved pairs."""
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    return (
        torch.ops.liger.group_norm(x, 32, w, b, 1e-5), *torch.ops.liger.group_norm_backward(x * 2, x, 32, w, b, 1e-5),
        *torch.ops.liger.poly_norm_backward(h * 2, h, pw, 1e-6),
        *torch.ops.liger.rope(qt, kt, cos, sin, ids), torch.ops.liger.rope_backward(qt, None, cos, sin, ids)[0],
        *torch.ops.liger.rope(qp, kp, cos, sin, None, cu),
        *torch.ops.liger.rope(qt, kt, cos, sin, ids, pairs="interleaved"),
    )  # fmt: skip


def _larger_inputs() -> tuple:
    dev, bf16 = "cuda", torch.bfloat16
    return (
        torch.randn(8, 512, 64, 64, device=dev, dtype=bf16), torch.randn(512, device=dev),
        torch.randn(512, device=dev), torch.randn(8192, 4096, device=dev, dtype=bf16), torch.randn(3, device=dev),
        torch.randn(2, 128, 8, 128, device=dev, dtype=bf16), torch.randn(2, 128, 2, 128, device=dev, dtype=bf16),
        torch.randn(4096, 128, device=dev), torch.randn(4096, 128, device=dev),
        torch.zeros(2, 128, dtype=torch.long, device=dev), torch.tensor([0, 100, 256], device=dev, dtype=torch.int32),
        torch.randn(256, 8, 128, device=dev, dtype=bf16), torch.randn(256, 2, 128, device=dev, dtype=bf16),
    )  # fmt: skip


def trace(decompose: bool = True, fn=_every_op, inputs=_inputs) -> dict:
    """Liger ops and kernel wrappers in the forward graph of ``fn``."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        raise _Traced  # the graph is all this wants; running it needs a GPU

    with FakeTensorMode(), _library.decomposition(decompose):
        try:
            aot_function(fn, fw_compiler=record)(*inputs())
        except _Traced:
            pass
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    return {
        "liger": sorted(t for t in targets if t.startswith("liger.")),
        "kernels": sum("triton_kernel_wrapper" in t for t in targets),
    }


def main() -> None:
    print(json.dumps({
        "decomposed": trace(),
        "opaque": trace(decompose=False),
        "larger": trace(fn=_larger_and_options, inputs=_larger_inputs),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
