"""torch.ops.liger.fused_linear_cross_entropy: loss and gradients of x,
weight and bias against a float64 reference, over chunk sizes, every option,
ignore_index-heavy and all-ignored batches; bad targets, determinism, which
gradients are computed, opcheck, torch.compile and second order."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from csrc_free_ops.cross_entropy import plan as ce_plan
from csrc_free_ops.cross_entropy import reference as ce_reference
from csrc_free_ops.cross_entropy.reference import Options
from csrc_free_ops.fused_linear_cross_entropy import launch, plan, reference
from tests.helpers import ALL_DTYPES, DEVICE, OPCHECK_UTILS, assert_close_to_scale, record_launches_and_reads
from tests.test_cross_entropy import IGNORE, make_counted_target, make_target, options

liger = torch.ops.liger


def reference_grads(x, weight, target, bias, ce_weight, o, grad_loss):
    leaves = [t.detach().double().requires_grad_() for t in (x, weight) + ((bias,) if bias is not None else ())]
    cw = None if ce_weight is None else ce_weight.double()
    loss = reference.forward(leaves[0], leaves[1], target, leaves[2] if bias is not None else None, cw, o)[0]
    return loss.detach(), torch.autograd.grad(loss, leaves, grad_loss.double())


def _magnitudes(z, target, cw, o, grad_loss):
    """The loss and its logits' gradient as the reference writes them
    (csrc_free_ops/cross_entropy/reference.py), each term taken by its
    magnitude: what float32 rounds each of them relative to."""
    r = ce_reference.rows(z, target, cw, o)
    s = ce_reference.capped(z, o.softcap).abs()
    n_classes, ls = s.shape[-1], o.label_smoothing
    w = torch.ones(n_classes, dtype=z.dtype, device=z.device) if cw is None else cw
    safe = torch.where(r.valid, target, 0).long()
    s_y = s.gather(1, safe[:, None]).squeeze(1)
    lse = r.lse.abs()
    loss = (1.0 - ls) * r.target_weight * (lse + s_y) + (ls / n_classes) * (w.sum() * lse + (s * w).sum(-1))
    loss = ce_reference.reduce(r._replace(loss=torch.where(r.valid, loss, 0.0)), o, z.dtype)[0]
    p = torch.exp(ce_reference.capped(z, o.softcap) - r.lse[:, None])
    onehot = torch.nn.functional.one_hot(safe, n_classes).to(z.dtype)
    a, b = (t.abs() for t in ce_reference.scales(grad_loss, r.valid, r.target_weight, o, z.dtype))
    g = a[:, None] * ((1.0 - ls) * r.target_weight[:, None] * (p + onehot) + (ls / n_classes) * (w.sum() * p + w))
    g = g + b[:, None] * (2.0 * o.lse_square_scale) * lse[:, None] * p
    return loss, torch.where(r.valid[:, None], g, 0.0)


def term_scales(x, weight, target, bias, ce_weight, o, grad_loss):
    """(loss, grad_x, grad_weight, grad_bias) scales for assert_close_to_scale
    with x's dtype bounding the terms.  The logits z are a matmul in x's dtype,
    each off by up to u|z| (u its rounding): the loss moves by up to
    u |dloss/dz| |z| and each element of the logits' gradient g by
    u |dg/dz| |z|, on top of the rounding of their own terms (_magnitudes);
    g is rounded to x's dtype for the gradient matmuls, whose sums over
    classes or rows can cancel far below their terms (two classes, or a bias
    summed over rows).  Over those sums the terms' independent roundings add
    in quadrature."""
    x64, w64 = x.detach().double(), weight.detach().double()
    z = reference.logits(x64, w64, None if bias is None else bias.detach().double())
    cw = None if ce_weight is None else ce_weight.double()
    grad_loss = grad_loss.double()

    def loss_of(logits):
        return ce_reference.forward(logits, target, cw, o)[0]

    def grad_of(logits):
        return torch.autograd.grad(loss_of(logits), logits, grad_loss, create_graph=True)[0]

    size = z.numel()
    moved_by = z.abs().reshape(size)
    loss_terms, g_terms = _magnitudes(z, target, cw, o, grad_loss)
    loss_scale = loss_terms + (torch.autograd.functional.jacobian(loss_of, z).abs().reshape(-1, size) @ moved_by)
    hessian = torch.autograd.functional.jacobian(grad_of, z).abs().reshape(size, size)
    g_square = (g_terms + (hessian @ moved_by).view_as(z)).square()
    sums = (g_square @ w64.square(), g_square.t() @ x64.square(), g_square.sum(0))
    return (loss_scale.reshape(loss_terms.shape), *(t.sqrt() for t in sums))


def assert_matches_reference(loss, grads, x, weight, target, bias, ce_weight, o, grad_loss, what=""):
    """loss (the compute dtype) and grads (x, weight and bias's dtypes) against
    the float64 reference, each within its own dtype's bound on its value plus
    x's dtype's bound on its terms (term_scales)."""
    ref_loss, ref_grads = reference_grads(x, weight, target, bias, ce_weight, o, grad_loss)
    scales = term_scales(x, weight, target, bias, ce_weight, o, grad_loss)
    assert_close_to_scale(loss, ref_loss, scales[0], loss.dtype, what + "loss", x.dtype)
    for got, want, scale, name in zip(grads, ref_grads, scales[1:], ("grad_x", "grad_weight", "grad_bias"),
                                      strict=False):  # fmt: skip
        assert_close_to_scale(got, want, scale, got.dtype, what + name, x.dtype)


def _plan(rows: int, n_classes: int) -> plan.Plan:
    return plan.Plan(rows, ce_plan.cuda(rows, n_classes))


@given(
    rows=st.integers(1, 20),
    hidden=st.integers(1, 24),
    n_classes=st.integers(1, 80),
    dtype=st.sampled_from(ALL_DTYPES),
    o=options,
    has_bias=st.booleans(),
    has_ce_weight=st.booleans(),
    ignored=st.sampled_from([0.0, 0.7]),
    chunk=st.sampled_from([1, 3, 8, 64]),
    class_slice=st.sampled_from([3, 16, 64]),
)
def test_loss_and_gradients_match_float64_reference(
    rows, hidden, n_classes, dtype, o, has_bias, has_ce_weight, ignored, chunk, class_slice
):
    target = make_target(rows, n_classes, ignored, o.ignore_index)
    if o.reduction == "mean" and not (target != o.ignore_index).any():
        o = o._replace(reduction="sum")  # the mean over no row is NaN: test_all_ignored_batch
    x = torch.randn(rows, hidden, device=DEVICE).to(dtype).requires_grad_()
    weight = (torch.randn(n_classes, hidden, device=DEVICE) / hidden**0.5).to(dtype).requires_grad_()
    bias = torch.randn(n_classes, device=DEVICE).to(dtype).requires_grad_() if has_bias else None
    ce_weight = torch.rand(n_classes, device=DEVICE) + 0.5 if has_ce_weight else None
    loss, z_loss, lse = liger.fused_linear_cross_entropy(x, weight, target, bias, ce_weight, *o)
    grad_loss = torch.randn_like(loss)
    leaves = (x, weight) + ((bias,) if has_bias else ())
    grads = torch.autograd.grad(loss, leaves, grad_loss)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    assert loss.dtype == compute and lse.dtype == compute
    assert [g.dtype for g in grads] == [t.dtype for t in leaves]
    assert_matches_reference(loss, grads, x, weight, target, bias, ce_weight, o, grad_loss)
    # The same through the launch sequence with a drawn chunk size.
    chunked = launch.forward(x.detach(), weight.detach(), target, None if bias is None else bias.detach(),
                             ce_weight, o, _plan(chunk, n_classes))  # fmt: skip
    mask = (True, True, has_bias)
    chunked_grads = launch.backward(grad_loss, x.detach(), weight.detach(), target, chunked[2],
                                    None if bias is None else bias.detach(), ce_weight, o, mask,
                                    _plan(chunk, n_classes))  # fmt: skip
    assert_matches_reference(chunked[0], chunked_grads, x, weight, target, bias, ce_weight, o, grad_loss, "chunked ")
    # And both in one walk, for a grad_loss of ones.
    both = launch.forward_with_grads(x.detach(), weight.detach(), target, None if bias is None else bias.detach(),
                                     ce_weight, o, mask, _plan(chunk, n_classes))  # fmt: skip
    assert_matches_reference(both[0], both[3:3 + len(leaves)], x, weight, target, bias, ce_weight, o,
                             torch.ones_like(loss), "with grads ")  # fmt: skip
    torch.testing.assert_close(both[2], chunked[2], rtol=0, atol=0)
    # And walking the classes, class_slice at a time.
    by_classes = launch.backward_by_classes(grad_loss, x.detach(), weight.detach(), target, chunked[2],
                                            None if bias is None else bias.detach(), ce_weight, o, mask, class_slice,
                                            ce_plan.cuda(rows, class_slice))  # fmt: skip
    assert_matches_reference(chunked[0], by_classes, x, weight, target, bias, ce_weight, o, grad_loss, "by classes ")


def test_chunk_rows_follow_x_size_and_free_memory():
    # x's size in logits, at least MIN_CHUNK_ROWS, a multiple of ROW_MULTIPLE: upstream's 512 at B2 S4096 V32000.
    assert plan.chunk_rows(8192, 2048, 32000, 2, None) == 512
    assert plan.chunk_rows(8192, 2048, 128256, 2, None) == plan.MIN_CHUNK_ROWS
    assert plan.chunk_rows(100, 2048, 128256, 2, None) == 100
    # A quarter of the free memory caps it.
    assert plan.chunk_rows(8192, 2048, 32000, 2, 4 * 32000 * 2 * 100) == 100
    assert plan.chunk_rows(8192, 2048, 32000, 2, 0) == 1
    assert plan.chunks(10, 4) == [(0, 4), (4, 8), (8, 10)]


def test_short_chunks_plan_a_class_walk_in_a_chunks_memory():
    # Chunks under CLASS_WALK_BELOW_ROWS rows walk the classes (Llama 3's vocabulary at B2 S4096, and B8 S512's 32k);
    # B2 S4096's 512-row chunks walk the rows, as does a single chunk.
    for rows, n_classes, want in ((8192, 128256, 3968), (4096, 32000, 1984), (8192, 32000, 0), (200, 128256, 0)):
        p = plan.cuda(rows, 2048, n_classes, 2, None)
        assert p.class_slice == want, (rows, n_classes, p)
        assert (p.class_ce is None) == (want == 0)
        if want:
            assert want % plan.CLASS_MULTIPLE == 0 and rows * want <= p.chunk_rows * n_classes
            assert p.class_ce == ce_plan.cuda(rows, want)
    # Memory so short that a slice would be narrower than one tile: the row walk, in the chunk's memory.
    assert plan.cuda(8192, 2048, 32000, 2, plan.FREE_MEMORY_SHARE * 32000 * 2 * 8).class_slice == 0


def test_short_chunks_record_the_forward_and_walk_the_classes_in_the_backward(monkeypatch):
    """The one walk is not taken where the backward walks the classes: the forward records the loss alone."""
    n_rows, n_classes, chunk = 12, 200, 4
    _limit_chunks(monkeypatch, chunk, n_classes, 4)
    walks = _Walks(monkeypatch)
    slices = []
    real = launch.backward_by_classes

    def by_classes(*args):
        slices.append(args[9])
        return real(*args)

    monkeypatch.setattr(launch, "backward_by_classes", by_classes)
    x, weight, bias, target = _head(rows=n_rows, n_classes=n_classes)
    o = Options(IGNORE, 0.1, "mean", 1e-3, None)
    loss = liger.fused_linear_cross_entropy(x, weight, target, bias, None, *o)[0]
    assert walks.take() == {"forward": 1, "backward": 0, "forward_with_grads": 0}
    grad_loss = torch.tensor(-2.5, device=DEVICE)
    grads = torch.autograd.grad(loss, (x, weight, bias), grad_loss)
    assert walks.take() == {"forward": 0, "backward": 1, "forward_with_grads": 0}
    assert slices == [plan.CLASS_MULTIPLE]  # 4 rows of 200 logits hold 66 classes of 12 rows: one tile
    assert_matches_reference(loss, grads, x, weight, target, bias, None, o, grad_loss)


def test_weight_gradient_is_bitwise_deterministic_over_chunks():
    x = torch.randn(40, 16, device=DEVICE, dtype=torch.bfloat16)
    weight = torch.randn(30, 16, device=DEVICE, dtype=torch.bfloat16)
    target = make_counted_target(40, 30, 0.3)
    o = Options(IGNORE, 0.1, "mean", 1e-3, None)
    p = _plan(8, 30)
    _, _, lse = launch.forward(x, weight, target, None, None, o, p)
    g = torch.tensor(1.0, device=DEVICE)
    first = launch.backward(g, x, weight, target, lse, None, None, o, (True, True, False), p)
    second = launch.backward(g, x, weight, target, lse, None, None, o, (True, True, False), p)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_only_the_gradients_asked_for_are_computed():
    x = torch.randn(6, 8, device=DEVICE, requires_grad=True)
    weight = torch.randn(11, 8, device=DEVICE)  # a frozen head
    bias = torch.randn(11, device=DEVICE)
    target = make_target(6, 11, 0.0)
    loss = liger.fused_linear_cross_entropy(x, weight, target, bias)[0]
    (grad_x,) = torch.autograd.grad(loss, x)
    assert grad_x.shape == x.shape
    lse = liger.fused_linear_cross_entropy(x.detach(), weight, target, bias)[2]
    outs = liger.fused_linear_cross_entropy_backward(
        torch.tensor(1.0, device=DEVICE), x.detach(), weight, target, lse, bias, None, IGNORE, 0.0, "mean", 0.0,
        None, [True, False, False],
    )  # fmt: skip
    assert outs[1] is None and outs[2] is None
    torch.testing.assert_close(outs[0], grad_x)
    # grad_x left out: an empty tensor (the schema's first output is a Tensor, as DTensor requires)
    outs = liger.fused_linear_cross_entropy_backward(
        torch.tensor(1.0, device=DEVICE), x.detach(), weight, target, lse, bias, None, IGNORE, 0.0, "mean", 0.0,
        None, [False, False, True],
    )  # fmt: skip
    assert outs[0].numel() == 0 and outs[1] is None and outs[2].shape == bias.shape
    with torch.no_grad():
        assert liger.fused_linear_cross_entropy(x, weight, target)[0].grad_fn is None


def _limit_chunks(monkeypatch, rows: int, n_classes: int, itemsize: int) -> None:
    """Free memory that caps the plan's chunks at ``rows`` rows of logits (plan.chunk_rows)."""
    monkeypatch.setenv("CSRC_FREE_OPS_FREE_BYTES", str(plan.FREE_MEMORY_SHARE * n_classes * itemsize * rows))


# The walks of WALK_ROWS rows, as (classes, rows per chunk): one chunk; chunks of 2 rows walked by rows
# (12 classes: a slice would be narrower than one tile); chunks of 3 rows whose backward walks 64-class slices.
WALK_ROWS = 7
WALKS = {"one chunk": (12, None), "row chunks": (12, 2), "class slices": (200, 3)}


def _take_walk(monkeypatch, walk: str, dtype: torch.dtype) -> int:
    """Makes the plan of WALK_ROWS rows of x in dtype take ``walk``; its class count."""
    n_classes, chunk = WALKS[walk]
    if chunk is not None:
        _limit_chunks(monkeypatch, chunk, n_classes, torch.empty((), dtype=dtype).element_size())
    p = launch._cuda_plan(torch.empty(WALK_ROWS, 8, dtype=dtype), torch.empty(n_classes, 8))
    assert (p.chunk_rows, bool(p.class_slice)) == (chunk or WALK_ROWS, walk == "class slices")
    return n_classes


@pytest.mark.parametrize("backend", ["cuda", "npu"])
def test_the_forward_takes_gradients_where_its_devices_plan_walks_rows(monkeypatch, backend):
    """gradients_in_forward asks the plan of x's backend (the NPU's float64 runs the reference: one walk)."""
    from csrc_free_ops import device

    monkeypatch.setattr(device, "backend_of", lambda t: backend)
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_UB_BYTES", str(192 * 1024))
    monkeypatch.setenv("CSRC_FREE_OPS_NPU_VECTOR_CORES", "40")
    for walk, want in (("row chunks", True), ("class slices", False)):
        n_classes = _take_walk(monkeypatch, walk, torch.float32)
        x, weight = torch.empty(WALK_ROWS, 8), torch.empty(n_classes, 8)
        assert launch.gradients_in_forward(x, weight, None) is want, walk
    n_classes = _take_walk(monkeypatch, "class slices", torch.float64)
    x, weight = torch.empty(WALK_ROWS, 8, dtype=torch.float64), torch.empty(n_classes, 8, dtype=torch.float64)
    assert launch.gradients_in_forward(x, weight, None) is (backend == "npu")


@pytest.mark.parametrize("walk", list(WALKS))
def test_mixed_dtypes_give_each_gradient_its_inputs_dtype(monkeypatch, walk):
    """bf16 activations with float32 master weights (the matmuls run in bf16), in every walk."""
    n_classes = _take_walk(monkeypatch, walk, torch.bfloat16)
    x = torch.randn(WALK_ROWS, 16, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(n_classes, 16, device=DEVICE, requires_grad=True)
    bias = torch.randn(n_classes, device=DEVICE, requires_grad=True)
    target = make_counted_target(WALK_ROWS, n_classes, 0.2)
    loss = liger.fused_linear_cross_entropy(x, weight, target, bias)[0]
    grads = torch.autograd.grad(loss, (x, weight, bias))
    assert [g.dtype for g in grads] == [torch.bfloat16, torch.float32, torch.float32]
    assert_matches_reference(loss, grads, x, weight, target, bias, None, Options(), torch.tensor(1.0))


def test_all_ignored_batch():
    x = torch.randn(5, 8, device=DEVICE, requires_grad=True)
    weight = torch.randn(7, 8, device=DEVICE, requires_grad=True)
    target = torch.full((5,), IGNORE, device=DEVICE)
    loss = liger.fused_linear_cross_entropy(x, weight, target)[0]
    assert torch.isnan(loss)
    gx, gw = torch.autograd.grad(loss, (x, weight))
    assert not gx.any() and not gw.any()
    assert liger.fused_linear_cross_entropy(x, weight, target, reduction="sum")[0].item() == 0.0


@pytest.mark.parametrize("bad", [7, -2])
def test_bad_targets_raise_a_clear_error(bad):
    x, weight = torch.randn(3, 4, device=DEVICE), torch.randn(7, 4, device=DEVICE)
    target = torch.tensor([0, IGNORE, bad], device=DEVICE)
    with pytest.raises(ValueError, match=rf"fused_linear_cross_entropy: target holds \[{bad}\].*outside \[0, 7\)"):
        liger.fused_linear_cross_entropy(x, weight, target)


@pytest.mark.parametrize("with_grads", [False, True])
def test_bad_targets_with_class_weights_raise_the_target_error(with_grads):
    """The class weights' lookup per row (the mean's denominator, the gradients' scales) runs before the
    check's read: a bad target must not index past them."""
    x = torch.randn(4, 4, device=DEVICE, requires_grad=with_grads)
    weight = torch.randn(7, 4, device=DEVICE, requires_grad=with_grads)
    ce_weight = torch.rand(7, device=DEVICE) + 0.5
    target = torch.tensor([0, 9, IGNORE, 3], device=DEVICE)
    with torch.set_grad_enabled(with_grads), pytest.raises(ValueError, match=r"target holds \[9\]"):
        liger.fused_linear_cross_entropy(x, weight, target, ce_weight=ce_weight)


@pytest.mark.parametrize("with_grads", [False, True])
def test_the_target_check_reads_the_host_after_the_walk_is_launched(monkeypatch, with_grads):
    """The one host read of the target check comes after every chunk's kernels are queued, in the
    forward alone and in the forward that also computes the gradients."""
    x = torch.randn(6, 4, device=DEVICE, requires_grad=with_grads)
    weight = torch.randn(7, 4, device=DEVICE, requires_grad=with_grads)
    target = torch.tensor([0, IGNORE, 3, 6, 1, 2], device=DEVICE)
    events = record_launches_and_reads(monkeypatch)
    with torch.set_grad_enabled(with_grads):
        liger.fused_linear_cross_entropy(x, weight, target)
    assert "launch" in events and "read" in events, events
    assert events.index("read") > max(i for i, e in enumerate(events) if e == "launch"), events


def _t(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype, device=DEVICE)


BAD_CALLS = [
    ("x must have shape \\(rows, hidden\\)", lambda: (_t(4), _t(3, 4), _t(4, dtype=torch.long))),
    ("weight must have shape \\(classes, 4\\)", lambda: (_t(2, 4), _t(3, 5), _t(2, dtype=torch.long))),
    ("target must have shape \\(2,\\)", lambda: (_t(2, 4), _t(3, 4), _t(3, dtype=torch.long))),
    ("bias must have shape \\(3,\\)", lambda: (_t(2, 4), _t(3, 4), _t(2, dtype=torch.long), _t(4))),
    ("ce_weight must have shape \\(3,\\)", lambda: (_t(2, 4), _t(3, 4), _t(2, dtype=torch.long), None, _t(2))),
    ("weight must be float32", lambda: (_t(2, 4), _t(3, 4, dtype=torch.int32), _t(2, dtype=torch.long))),
]


class _Walks:
    """Counts the launch sequences a call runs: the loss alone, its gradients, or both in one walk."""

    def __init__(self, monkeypatch):
        self.counts = {"forward": 0, "backward": 0, "forward_with_grads": 0}
        for name in self.counts:
            monkeypatch.setattr(launch, name, self._counted(name, getattr(launch, name)))

    def _counted(self, name, fn):
        def run(*args, **kwargs):
            self.counts[name] += 1
            return fn(*args, **kwargs)

        return run

    def take(self) -> dict:
        counts = dict(self.counts)
        self.counts.update(dict.fromkeys(counts, 0))
        return counts


def _head(rows=12, hidden=8, n_classes=15, dtype=torch.float32, bias=True):
    x = torch.randn(rows, hidden, device=DEVICE, dtype=dtype, requires_grad=True)
    weight = (torch.randn(n_classes, hidden, device=DEVICE) / hidden**0.5).to(dtype).requires_grad_()
    b = torch.randn(n_classes, device=DEVICE, dtype=dtype, requires_grad=True) if bias else None
    return x, weight, b, make_counted_target(rows, n_classes, 0.3)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_a_recorded_scalar_loss_takes_its_gradients_in_the_forward_walk(monkeypatch, reduction):
    """One walk over the chunks for forward and backward; the backward scales what it held by grad_loss."""
    walks = _Walks(monkeypatch)
    x, weight, bias, target = _head()
    o = Options(IGNORE, 0.1, reduction, 1e-3, None)
    loss = liger.fused_linear_cross_entropy(x, weight, target, bias, None, *o)[0]
    assert walks.take() == {"forward": 0, "backward": 0, "forward_with_grads": 1}
    grad_loss = torch.tensor(-2.5, device=DEVICE)
    grads = torch.autograd.grad(loss, (x, weight, bias), grad_loss)
    assert walks.take() == {"forward": 0, "backward": 0, "forward_with_grads": 0}
    assert_matches_reference(loss, grads, x, weight, target, bias, None, o, grad_loss)
    assert loss.grad_fn._grads is None  # taken by the backward, which owned them alone


def test_held_gradients_are_scaled_by_one_foreach_call_per_dtype(monkeypatch):
    """bf16 x with a float32 head and bias: each dtype's held gradients are scaled by one _foreach_mul_ with
    grad_loss in that dtype (per-tensor mul_ by a 0-d CUDA tensor runs unvectorized), here by a grad_loss
    that bf16 cannot hold exactly."""
    calls = []
    foreach_mul_ = torch._foreach_mul_

    def recorded(tensors, scale):
        calls.append((tuple(t.dtype for t in tensors), scale.dtype, scale.shape))
        return foreach_mul_(tensors, scale)

    monkeypatch.setattr(torch, "_foreach_mul_", recorded)
    walks = _Walks(monkeypatch)
    x, weight, bias, target = _head()
    x = x.detach().to(torch.bfloat16).requires_grad_()
    loss = liger.fused_linear_cross_entropy(x, weight, target, bias)[0]
    assert walks.take()["forward_with_grads"] == 1
    grad_loss = torch.tensor(1.0 / 3.0, device=DEVICE)
    grads = torch.autograd.grad(loss, (x, weight, bias), grad_loss)
    bf16, fp32 = torch.bfloat16, torch.float32
    assert sorted(calls, key=str) == sorted([((bf16,), bf16, ()), ((fp32, fp32), fp32, ())], key=str)
    assert [g.dtype for g in grads] == [bf16, fp32, fp32]
    assert_matches_reference(loss, grads, x, weight, target, bias, None, Options(), grad_loss)


def test_a_modules_head_takes_the_forward_walk(monkeypatch):
    """The LM head is an nn.Parameter (a Tensor subclass of no dispatch of its own), as in every model."""
    walks = _Walks(monkeypatch)
    head = torch.nn.Linear(8, 15, device=DEVICE)
    x, _, _, target = _head()
    loss = liger.fused_linear_cross_entropy(x, head.weight, target, head.bias)[0]
    loss.backward()
    assert walks.take() == {"forward": 0, "backward": 0, "forward_with_grads": 1}
    assert head.weight.grad is not None and head.bias.grad is not None and x.grad is not None


def test_gradients_held_from_the_forward_serve_one_backward_and_recomputing_serves_the_rest(monkeypatch):
    walks = _Walks(monkeypatch)
    x, weight, bias, target = _head()
    loss = liger.fused_linear_cross_entropy(x, weight, target, bias)[0]
    first = torch.autograd.grad(loss, (x, weight, bias), retain_graph=True)
    second = torch.autograd.grad(loss, (x, weight, bias))
    assert walks.take() == {"forward": 0, "backward": 1, "forward_with_grads": 1}
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b)
    assert_matches_reference(loss, second, x, weight, target, bias, None, Options(), torch.tensor(1.0))


def test_a_differentiated_backward_recomputes_through_the_backward_op(monkeypatch):
    walks = _Walks(monkeypatch)
    x, weight, _, target = _head(dtype=torch.float64, bias=False)
    loss = liger.fused_linear_cross_entropy(x, weight, target, None, None, IGNORE, 0.0, "sum")[0]
    (grad_x,) = torch.autograd.grad(loss, x, create_graph=True)
    (hvp,) = torch.autograd.grad(grad_x.square().sum(), weight)
    assert walks.take()["backward"] == 1

    def reference_grad_x(x, weight):
        ref = reference.forward(x, weight, target, None, None, Options(IGNORE, 0.0, "sum"))[0]
        return torch.autograd.grad(ref, x, create_graph=True)[0]

    x64, w64 = x.detach().requires_grad_(), weight.detach().requires_grad_()
    (want,) = torch.autograd.grad(reference_grad_x(x64, w64).square().sum(), w64)
    torch.testing.assert_close(hvp, want)


@pytest.mark.parametrize("case", ["none", "no_grad", "frozen"])
def test_calls_that_cannot_use_forward_gradients_compute_none_there(monkeypatch, case):
    walks = _Walks(monkeypatch)
    x, weight, bias, target = _head()
    if case == "none":
        loss = liger.fused_linear_cross_entropy(x, weight, target, bias, reduction="none")[0]
        grad_loss = torch.randn_like(loss)
        grads = torch.autograd.grad(loss, (x, weight, bias), grad_loss)
        assert walks.take() == {"forward": 1, "backward": 1, "forward_with_grads": 0}
        assert_matches_reference(loss, grads, x, weight, target, bias, None, Options(reduction="none"), grad_loss)
        return
    if case == "no_grad":
        with torch.no_grad():
            liger.fused_linear_cross_entropy(x, weight, target, bias)
    else:
        liger.fused_linear_cross_entropy(x.detach(), weight.detach(), target, bias.detach())
    assert walks.take() == {"forward": 1, "backward": 0, "forward_with_grads": 0}


def test_forward_gradients_follow_what_requires_grad():
    x, weight, bias, target = _head()
    weight.requires_grad_(False)  # a frozen head
    loss = liger.fused_linear_cross_entropy(x, weight, target, bias)[0]
    held = loss.grad_fn._grads
    assert held[0] is not None and held[1] is None and held[2] is not None
    grads = torch.autograd.grad(loss, (x, bias))
    lse = liger.fused_linear_cross_entropy(x.detach(), weight, target, bias.detach())[2]
    args = (torch.tensor(1.0, device=DEVICE), x.detach(), weight, target, lse, bias.detach(), None, *Options())
    recomputed = liger.fused_linear_cross_entropy_backward(*args, [True, False, True])
    torch.testing.assert_close(grads, (recomputed[0], recomputed[2]))


@pytest.mark.parametrize("walk", ["forward", "backward", "forward_with_grads"])
def test_one_chunk_buffer_is_alive_at_a_time(monkeypatch, walk):
    """Each chunk's logits buffer is freed before the next is allocated (the loss's memory peak)."""
    import weakref

    made = []

    def logits(*args):
        assert all(r() is None for r in made), "the previous chunk's logits are still alive"
        out = real(*args)
        made.append(weakref.ref(out))
        return out

    real = launch._logits
    monkeypatch.setattr(launch, "_logits", logits)
    x, weight, _, target = _head(rows=20, bias=False)
    x, weight, o, p = x.detach(), weight.detach(), Options(), _plan(4, weight.shape[0])
    if walk == "forward":
        launch.forward(x, weight, target, None, None, o, p)
    elif walk == "forward_with_grads":
        launch.forward_with_grads(x, weight, target, None, None, o, (True, True, False), p)
    else:
        lse = torch.zeros(20, device=DEVICE)
        launch.backward(torch.tensor(1.0, device=DEVICE), x, weight, target, lse, None, None, o, (True, True, False), p)
    assert len(made) == 5


@pytest.mark.parametrize(("message", "make_args"), BAD_CALLS)
@pytest.mark.parametrize("recorded", [False, True], ids=["unrecorded", "recorded"])
def test_bad_input_raises_clear_error(message, make_args, recorded):
    """Also in a recorded forward, whose choice of walk looks at the inputs before the op's check."""
    args = make_args()
    if recorded:
        args = [a.requires_grad_() if a is not None and a.is_floating_point() else a for a in args]
    with pytest.raises((ValueError, TypeError), match=message):
        liger.fused_linear_cross_entropy(*args)


def test_gradcheck_and_gradgradcheck_in_float64():
    x = torch.randn(5, 3, dtype=torch.float64, device=DEVICE, requires_grad=True)
    weight = torch.randn(4, 3, dtype=torch.float64, device=DEVICE, requires_grad=True)
    bias = torch.randn(4, dtype=torch.float64, device=DEVICE, requires_grad=True)
    target = torch.tensor([0, IGNORE, 3, 2, 1], device=DEVICE)

    def loss(x, weight, bias):
        return liger.fused_linear_cross_entropy(x, weight, target, bias, None, IGNORE, 0.1, "sum", 1e-2, 3.0)[0]

    assert torch.autograd.gradcheck(loss, (x, weight, bias))
    assert torch.autograd.gradgradcheck(loss, (x, weight, bias))


@pytest.mark.parametrize(
    ("dtype", "o"), [(torch.float32, Options()), (torch.bfloat16, Options(IGNORE, 0.1, "none", 1e-3, 10.0))]
)
def test_opcheck(dtype, o):
    x = torch.randn(6, 8, device=DEVICE, dtype=dtype, requires_grad=True)
    weight = torch.randn(10, 8, device=DEVICE, dtype=dtype, requires_grad=True)
    bias = torch.randn(10, device=DEVICE, dtype=dtype, requires_grad=True)
    target = make_counted_target(6, 10, 0.3)
    ce_weight = torch.rand(10, device=DEVICE)
    torch.library.opcheck(liger.fused_linear_cross_entropy.default, (x, weight, target, bias, ce_weight, *o),
                          test_utils=OPCHECK_UTILS)  # fmt: skip
    lse = liger.fused_linear_cross_entropy(x.detach(), weight.detach(), target, bias.detach(), ce_weight, *o)[2]
    grad_loss = torch.randn(6 if o.reduction == "none" else (), device=DEVICE)
    args = (grad_loss, x.detach(), weight.detach(), target, lse, bias.detach(), ce_weight, *o, [True, True, True])
    torch.library.opcheck(liger.fused_linear_cross_entropy_backward.default, args, test_utils=OPCHECK_UTILS)
    args = (x, weight, target, bias, ce_weight, *o, [True, False, True])
    torch.library.opcheck(liger.fused_linear_cross_entropy_with_grads.default, args, test_utils=OPCHECK_UTILS)


@pytest.mark.parametrize("walk", list(WALKS))
def test_compile_fullgraph_matches_eager(monkeypatch, walk):
    """On CUDA each walk compiles to its slices and kernels in Inductor's graph."""
    n_classes = _take_walk(monkeypatch, walk, torch.float32)

    def model(h, weight, target):
        return liger.fused_linear_cross_entropy(torch.tanh(h), weight, target, None, None, IGNORE, 0.0, "mean")[0]

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    h = torch.randn(WALK_ROWS, 8, device=DEVICE, requires_grad=True)
    weight = torch.randn(n_classes, 8, device=DEVICE, requires_grad=True)
    target = make_counted_target(WALK_ROWS, n_classes, 0.3)
    out = compiled(h, weight, target)
    torch.testing.assert_close(out, model(h, weight, target))
    got = torch.autograd.grad(out, (h, weight))
    want = torch.autograd.grad(model(h, weight, target), (h, weight))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_torch_func_grad_and_jvp_match_the_reference():
    x = torch.randn(5, 4, dtype=torch.float64, device=DEVICE)
    weight = torch.randn(6, 4, dtype=torch.float64, device=DEVICE)
    target = torch.tensor([1, IGNORE, 3, 5, 0], device=DEVICE)
    o = Options(IGNORE, 0.1, "mean", 1e-2, None)

    def ours(x, weight):
        return liger.fused_linear_cross_entropy(x, weight, target, None, None, *o)[0]

    def ref(x, weight):
        return reference.forward(x, weight, target, None, None, o)[0]

    tangents = (torch.randn_like(x), torch.randn_like(weight))
    torch.testing.assert_close(torch.func.jvp(ours, (x, weight), tangents)[1],
                               torch.func.jvp(ref, (x, weight), tangents)[1])  # fmt: skip
    for got, want in zip(torch.func.grad(ours, (0, 1))(x, weight), torch.func.grad(ref, (0, 1))(x, weight),
                         strict=True):  # fmt: skip
        torch.testing.assert_close(got, want)
