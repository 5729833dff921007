"""The graphs AOTAutograd traces for the liger ops on CUDA tensors, checked
without a GPU: fake CUDA tensors, the real (compiled, not interpreted) Triton
kernels.  ``python -m tests.decomposition_check`` prints, per case, the
liger ops left in the traced graph, the triton_kernel_wrapper nodes in it and
the launches that write into part of a larger buffer, and the row norms and
GLUs traced as their references' math (decomposition("math")), as JSON;
tests/test_decomposition.py runs it in a fresh process (the
interpreter's kernels, which the rest of the CPU suite runs, are no
JITFunctions and cannot be wrapped)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator

os.environ.setdefault("CSRC_FREE_OPS_NUM_SMS", "132")
os.environ.setdefault("CSRC_FREE_OPS_FREE_BYTES", str(40 << 30))  # the fused loss's plan: an H100's free memory

import torch  # noqa: E402
import triton  # noqa: E402
from torch._functorch.aot_autograd import aot_function  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import csrc_free_ops  # noqa: E402, F401
from csrc_free_ops.group_norm import launch as group_norm_launch  # noqa: E402
from csrc_free_ops.group_norm.residency import CudaDevice  # noqa: E402
from registrations import _library  # noqa: E402
from tests.cuda_compile_check import _Sm90Driver  # noqa: E402

# Without a GPU: no device properties (no one-pass group_norm plans).
group_norm_launch._cuda_device = lambda dev, sms: CudaDevice(sms)


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


def _losses(x, head, target, logits):
    """The fused loss over several row chunks (the forward alone, as where the backward walks the
    classes, and with its gradients) and its backward op, which stay opaque, and cross_entropy on given
    logits, which is decomposed."""
    options = (-100, 0.0, "mean", 0.0, None)
    loss, _, lse = torch.ops.liger.fused_linear_cross_entropy(x, head, target, None, None, *options)
    with_grads = torch.ops.liger.fused_linear_cross_entropy_with_grads(x, head, target, None, None, *options,
                                                                      [True, True, False])  # fmt: skip
    grads = torch.ops.liger.fused_linear_cross_entropy_backward(loss, x, head, target, lse, None, None, *options,
                                                                [True, True, False])  # fmt: skip
    ce = torch.ops.liger.cross_entropy(logits, target.narrow(0, 0, 64), None, *options)
    return (loss, *with_grads[:2], with_grads[3], *grads[:2], ce[0])


def _row_norms_and_glu(x, wide, w, w_wide, gate, up):
    """The row norms at a hidden size and at a wide row (the column-blocked kernels), with their
    backward ops, and the gated MLP's two ops with theirs."""
    grads = []
    for h, weight in ((x, w), (wide, w_wide)):
        bias = weight + 1  # a tensor of its own: one tensor in two parameters keeps the op opaque
        grads += torch.ops.liger.rms_norm_backward(h * 2, h, weight, 1e-6)
        grads += torch.ops.liger.layer_norm_backward(h * 2, h, weight, bias, 1e-5)
        grads += [torch.ops.liger.rms_norm(h, weight, 1e-6), torch.ops.liger.layer_norm(h, weight, bias, 1e-5)]
    grads += [torch.ops.liger.swiglu(gate, up), *torch.ops.liger.swiglu_backward(gate * 2, gate, up)]
    grads += [torch.ops.liger.geglu(gate, up), *torch.ops.liger.geglu_backward(gate * 2, gate, up)]
    return tuple(grads)


def _row_norm_and_glu_inputs() -> tuple:
    dev, bf16 = "cuda", torch.bfloat16
    return (
        torch.randn(4096, 2048, device=dev, dtype=bf16), torch.randn(64, 32768, device=dev, dtype=bf16),
        torch.randn(2048, device=dev), torch.randn(32768, device=dev),
        torch.randn(4096, 5632, device=dev, dtype=bf16), torch.randn(4096, 5632, device=dev, dtype=bf16),
    )  # fmt: skip


def _loss_inputs() -> tuple:
    dev, bf16 = "cuda", torch.bfloat16  # Llama B8 S512's head: 16 chunks of 256 rows
    return (
        torch.randn(4096, 2048, device=dev, dtype=bf16), torch.randn(32000, 2048, device=dev, dtype=bf16),
        torch.randint(0, 32000, (4096,), device=dev), torch.randn(64, 32000, device=dev, dtype=bf16),
    )  # fmt: skip


def _forward_graph(fn, inputs, decompose: bool | str = True):
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        raise _Traced  # the graph is all this wants; running it needs a GPU

    with FakeTensorMode(), _library.decomposition(decompose):
        try:
            aot_function(fn, fw_compiler=record)(*inputs())
        except _Traced:
            pass
    return graphs[0]


def _ops_and_kernels(graph: torch.fx.Graph) -> dict:
    """Liger ops and kernel wrappers in a traced forward graph."""
    targets = [str(n.target) for n in graph.nodes if n.op == "call_function"]
    return {
        "liger": sorted(t for t in targets if t.startswith("liger.")),
        "kernels": sum("triton_kernel_wrapper" in t for t in targets),
    }


def _part_of_larger(node) -> bool:
    """node's value is a view covering only part of its storage (a slice, not a transpose of it all)."""
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or not getattr(getattr(node, "target", None), "is_view", False):
        return False
    return value.numel() * value.element_size() < value.untyped_storage().nbytes()


def _views_written(graph: torch.fx.Graph) -> list[str]:
    """The kernel arguments a traced launch writes that are views of part of a larger tensor.  A
    write into a view becomes a clone and a scatter back into its base per launch, a pattern
    Inductor has compiled into reads past a buffer's end."""
    found = []
    for node in graph.nodes:
        if node.op == "call_function" and "triton_kernel_wrapper" in str(node.target):
            for name in node.kwargs.get("tensors_to_clone", []):
                source = node.kwargs["kwargs"][name]
                if _part_of_larger(source):
                    found.append(f"{node.kwargs['kernel_idx']}:{name} <- {source.target}")
    return found


@contextlib.contextmanager
def _sm90_write_analysis() -> Iterator[None]:
    """torch's analysis of which tensors a kernel writes, with the sm_90 driver standing in for a GPU's
    (without one torch counts every argument as written)."""
    driver = triton.runtime.driver
    real = driver._active
    driver.set_active(_Sm90Driver(real))
    try:
        yield
    finally:
        driver._active = real


# name: (function, its inputs), each traced decomposed
DECOMPOSED = {
    "decomposed": (_every_op, _inputs),
    "larger": (_larger_and_options, _larger_inputs),
    "losses": (_losses, _loss_inputs),
    "row_norms_and_glu": (_row_norms_and_glu, _row_norm_and_glu_inputs),
}


def main() -> None:
    with _sm90_write_analysis():
        graphs = {name: _forward_graph(fn, inputs).graph for name, (fn, inputs) in DECOMPOSED.items()}
    found = {name: _ops_and_kernels(graph) for name, graph in graphs.items()}
    found["opaque"] = _ops_and_kernels(_forward_graph(_every_op, _inputs, decompose=False).graph)
    # The row norms' and GLUs' references only: the others' use Python scalars in CUDA ops (torch.where(m, t,
    # 0), w[0] * x), which fake CUDA tensors cannot take on a CPU build of torch (the GPU tests trace them all).
    found["math"] = _ops_and_kernels(_forward_graph(*DECOMPOSED["row_norms_and_glu"], decompose="math").graph)
    found["views_written"] = [view for graph in graphs.values() for view in _views_written(graph)]
    print(json.dumps(found))


if __name__ == "__main__":
    main()
