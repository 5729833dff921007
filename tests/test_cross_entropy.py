"""torch.ops.liger.cross_entropy: loss and gradient against a float64
reference (itself checked against torch's F.cross_entropy), every option,
ignore_index-heavy and all-ignored batches, bad targets, determinism,
opcheck, torch.compile and second-order gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from csrc_free_ops.cross_entropy import launch, plan, reference
from csrc_free_ops.cross_entropy.reference import Options
from tests.helpers import ALL_DTYPES, DEVICE, OPCHECK_UTILS, assert_close_to_ref, record_launches_and_reads

IGNORE = -100


def make_target(rows: int, n_classes: int, ignored: float, ignore_index: int = IGNORE) -> torch.Tensor:
    target = torch.randint(0, n_classes, (rows,), device=DEVICE)
    drop = torch.rand(rows, device=DEVICE) < ignored
    return torch.where(drop, torch.full_like(target, ignore_index), target)


def make_counted_target(rows: int, n_classes: int, ignored: float) -> torch.Tensor:
    """make_target with its first row counted: a mean over no counted row is NaN, which a test of
    something else must not draw by chance (0.3 ** 6 of the time at 6 rows); the fuzz and the
    all-ignored tests draw it on purpose."""
    target = make_target(rows, n_classes, ignored)
    target[0] = torch.randint(0, n_classes, (), device=DEVICE)
    return target


def torch_loss(logits, target, weight, o: Options):
    """The loss as torch writes it: F.cross_entropy on softcapped logits plus upstream's z-loss."""
    s = reference.capped(logits, o.softcap)
    ce = F.cross_entropy(s, target, weight=weight, ignore_index=o.ignore_index, label_smoothing=o.label_smoothing,
                         reduction=o.reduction)  # fmt: skip
    valid = target != o.ignore_index
    z = torch.where(valid, o.lse_square_scale * torch.logsumexp(s, -1) ** 2, 0.0)
    if o.reduction == "none":
        return ce + z
    return ce + (z.sum() if o.reduction == "sum" else z.sum() / valid.sum())


def reference_loss_and_grad(logits, target, weight, o: Options, grad_loss):
    x = logits.detach().double().requires_grad_()
    w = None if weight is None else weight.double()
    loss, _, _ = reference.forward(x, target, w, o)
    (grad,) = torch.autograd.grad(loss, x, grad_loss.double())
    return loss.detach(), grad


options = st.builds(
    Options,
    ignore_index=st.sampled_from([IGNORE, 0]),
    label_smoothing=st.sampled_from([0.0, 0.1]),
    reduction=st.sampled_from(["mean", "sum", "none"]),
    lse_square_scale=st.sampled_from([0.0, 1e-3]),
    softcap=st.sampled_from([None, 20.0]),
)


@given(
    rows=st.integers(1, 9),
    n_classes=st.integers(1, 300),
    dtype=st.sampled_from(ALL_DTYPES),
    o=options,
    has_weight=st.booleans(),
    ignored=st.sampled_from([0.0, 0.6, 0.95]),
)
def test_loss_and_gradient_match_float64_reference(rows, n_classes, dtype, o, has_weight, ignored):
    target = make_target(rows, n_classes, ignored, o.ignore_index)
    if o.reduction == "mean" and not (target != o.ignore_index).any():
        o = o._replace(reduction="sum")  # the mean over no row is NaN: test_all_ignored_batch_matches_torch
    logits = (torch.randn(rows, n_classes, device=DEVICE) * 3).to(dtype).requires_grad_()
    weight = torch.rand(n_classes, device=DEVICE) + 0.5 if has_weight else None
    loss, z_loss, lse = torch.ops.liger.cross_entropy(logits, target, weight, *o)
    grad_loss = torch.randn_like(loss)
    (grad,) = torch.autograd.grad(loss, logits, grad_loss)
    ref_loss, ref_grad = reference_loss_and_grad(logits, target, weight, o, grad_loss)
    assert loss.dtype == dtype and grad.dtype == dtype and lse.dtype == reference.compute_dtype(logits)
    assert_close_to_ref(loss, ref_loss, dtype, "loss")
    assert_close_to_ref(grad, ref_grad, dtype, "grad_logits")
    ref_z = reference.forward(logits.detach().double(), target, None if weight is None else weight.double(), o)[1]
    assert_close_to_ref(z_loss, ref_z, dtype, "z_loss")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_reference_matches_torch_cross_entropy(reduction):
    o = Options(IGNORE, 0.1, reduction, 1e-2, 7.0)
    logits = torch.randn(11, 37, dtype=torch.float64)
    target = make_counted_target(11, 37, 0.3).cpu()
    weight = torch.rand(37, dtype=torch.float64) + 0.5
    for w in (None, weight):
        torch.testing.assert_close(reference.forward(logits, target, w, o)[0], torch_loss(logits, target, w, o),
                                   rtol=1e-12, atol=1e-12)  # fmt: skip


def test_multi_block_rows_through_the_launch_sequence():
    """Rows longer than the column block: the online softmax across blocks."""
    o = Options(IGNORE, 0.1, "sum", 1e-3, 15.0)
    logits = torch.randn(5, 203, device=DEVICE, dtype=torch.float64)
    target = make_counted_target(5, 203, 0.3)
    weight = torch.rand(203, device=DEVICE, dtype=torch.float64)
    p = plan.Plan(block_n=32, programs=2)
    loss, _, lse = launch.forward(logits, target, weight, o, p)
    grad_loss = torch.tensor(1.5, dtype=torch.float64, device=DEVICE)
    grad = launch.backward(grad_loss, logits, target, lse, weight, o, p)
    ref_loss, ref_grad = reference_loss_and_grad(logits, target, weight, o, grad_loss)
    assert_close_to_ref(loss, ref_loss, torch.float64, "loss")
    assert_close_to_ref(grad, ref_grad, torch.float64, "grad_logits")


def test_float64_options_reach_the_kernels_exactly():
    """label_smoothing 0.1 and softcap 0.3 are not float32 numbers: a float32
    copy of either moves a float64 loss by ~1e-9, far beyond float64's bound."""
    o = Options(IGNORE, 0.1, "sum", 0.1, 0.3)
    logits = torch.randn(4, 64, device=DEVICE, dtype=torch.float64)
    target = make_target(4, 64, 0.0)
    loss = torch.ops.liger.cross_entropy(logits, target, None, *o)[0]
    torch.testing.assert_close(loss, reference.forward(logits, target, None, o)[0], rtol=1e-14, atol=0)


@pytest.mark.parametrize("has_weight", [False, True])
def test_all_ignored_batch_matches_torch(has_weight):
    """Mean over zero rows is 0 / 0 = NaN, as F.cross_entropy gives; sum is 0;
    the gradient is zero either way."""
    logits = torch.randn(6, 20, device=DEVICE, requires_grad=True)
    target = torch.full((6,), IGNORE, device=DEVICE)
    weight = torch.rand(20, device=DEVICE) if has_weight else None
    mean = torch.ops.liger.cross_entropy(logits, target, weight)[0]
    expected = F.cross_entropy(logits.detach().double(), target, None if weight is None else weight.double())
    assert torch.isnan(mean) and torch.isnan(expected)
    (grad,) = torch.autograd.grad(mean, logits)
    assert torch.equal(grad, torch.zeros_like(grad))
    total = torch.ops.liger.cross_entropy(logits, target, weight, reduction="sum")[0]
    assert total.item() == 0.0


def test_zero_rows():
    logits = torch.randn(0, 9, device=DEVICE, requires_grad=True)
    target = torch.zeros(0, dtype=torch.long, device=DEVICE)
    assert torch.isnan(torch.ops.liger.cross_entropy(logits, target)[0])
    loss = torch.ops.liger.cross_entropy(logits, target, reduction="sum")[0]
    assert loss.item() == 0.0
    assert torch.autograd.grad(loss, logits)[0].shape == (0, 9)


@pytest.mark.parametrize("bad", [9, 50, -1, -7])
def test_bad_targets_raise_a_clear_error(bad):
    logits = torch.randn(4, 9, device=DEVICE)
    target = torch.tensor([1, bad, IGNORE, 3], device=DEVICE)
    with pytest.raises(ValueError, match=rf"target holds \[{bad}\].*outside \[0, 9\) and not ignore_index=-100"):
        torch.ops.liger.cross_entropy(logits, target)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_bad_targets_with_class_weights_raise_the_target_error(reduction):
    """The weights' lookup per row runs before the check's read: a bad target must not index past them."""
    logits = torch.randn(4, 9, device=DEVICE, requires_grad=True)
    weight = torch.rand(9, device=DEVICE) + 0.5
    target = torch.tensor([1, 40, IGNORE, -5], device=DEVICE)
    with pytest.raises(ValueError, match=r"target holds \[40, -5\] \(first of 2 bad\)"):
        torch.ops.liger.cross_entropy(logits, target, weight, reduction=reduction)


@pytest.mark.parametrize("bad", [None, 40])
def test_the_target_check_reads_the_host_after_the_kernels_are_launched(monkeypatch, bad):
    """The check's one host read waits for the device only once the op's kernels are queued (a read
    before them would idle the device while the host launched them); bad targets still raise."""
    logits = torch.randn(5, 9, device=DEVICE)
    target = make_counted_target(5, 9, 0.3)
    if bad is not None:
        target[2] = bad
    events = record_launches_and_reads(monkeypatch)
    if bad is None:
        torch.ops.liger.cross_entropy(logits, target)
    else:
        with pytest.raises(ValueError, match=r"target holds \[40\]"):
            torch.ops.liger.cross_entropy(logits, target)
    assert "launch" in events and "read" in events, events
    assert events.index("read") > max(i for i, e in enumerate(events) if e == "launch"), events


def test_bad_target_rows_are_nan_where_the_check_cannot_run():
    """Kernels never index with a bad target: its row's loss and gradient are NaN."""
    o = Options(IGNORE, 0.0, "none", 0.0, None)
    logits = torch.randn(3, 9, device=DEVICE)
    target = torch.tensor([1, 40, -3], device=DEVICE)
    p = plan.cuda(3, 9)
    loss, _, lse = launch.forward(logits, target, None, o, p)
    assert torch.isfinite(loss[0]) and torch.isnan(loss[1:]).all()
    grad = launch.backward(torch.ones(3, device=DEVICE), logits, target, lse, None, o, p)
    assert torch.isfinite(grad[0]).all() and torch.isnan(grad[1:]).all()


def test_backward_is_bitwise_deterministic():
    logits = torch.randn(7, 300, device=DEVICE, dtype=torch.bfloat16)
    target = make_counted_target(7, 300, 0.3)
    weight = torch.rand(300, device=DEVICE)
    o = Options(IGNORE, 0.1, "mean", 1e-3, None)
    _, _, lse = torch.ops.liger.cross_entropy(logits, target, weight, *o)
    g = torch.tensor(1.0, device=DEVICE)
    first = torch.ops.liger.cross_entropy_backward(g, logits, target, lse, weight, *o)
    assert torch.equal(first, torch.ops.liger.cross_entropy_backward(g, logits, target, lse, weight, *o))


def test_traced_backward_with_class_weights_and_no_smoothing_reads_no_placeholder():
    """A traced launch (torch.compile) passes an empty tensor for the unused
    sum of the class weights; the backward read it (address 0 on a GPU)."""
    from csrc_free_ops import launcher

    logits = torch.randn(6, 40, device=DEVICE)
    target = make_counted_target(6, 40, 0.3)
    weight = torch.rand(40, device=DEVICE) + 0.5
    o = Options(IGNORE, 0.0, "mean", 1e-3, None)
    p = plan.cuda(*logits.shape)
    _, _, lse = launch.forward(logits, target, weight, o, p)
    g = torch.tensor(1.0, device=DEVICE)
    want = launch.backward(g, logits, target, lse, weight, o, p)
    with launcher.traced_launches():
        got = launch.backward(g, logits, target, lse, weight, o, p)
    assert torch.equal(got, want)


def test_no_grad_forward_and_class_weight_gradient():
    logits = torch.randn(3, 5, device=DEVICE, requires_grad=True)
    target = make_target(3, 5, 0.0)
    with torch.no_grad():
        loss = torch.ops.liger.cross_entropy(logits, target)[0]
    assert loss.grad_fn is None
    weight = torch.rand(5, device=DEVICE, requires_grad=True)
    loss = torch.ops.liger.cross_entropy(logits, target, weight)[0]
    with pytest.raises(RuntimeError, match="gradient of the class weights is not implemented"):
        loss.backward()


def test_gradcheck_and_gradgradcheck_in_float64():
    logits = torch.randn(4, 6, dtype=torch.float64, device=DEVICE, requires_grad=True)
    target = torch.tensor([0, IGNORE, 5, 2], device=DEVICE)
    weight = torch.rand(6, dtype=torch.float64, device=DEVICE)

    def loss(x):
        return torch.ops.liger.cross_entropy(x, target, weight, IGNORE, 0.1, "mean", 1e-2, 3.0)[0]

    assert torch.autograd.gradcheck(loss, (logits,))
    assert torch.autograd.gradgradcheck(loss, (logits,))


def _t(*shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype, device=DEVICE)


def _target(*shape, dtype=torch.long):
    return torch.zeros(shape, dtype=dtype, device=DEVICE)


BAD_CALLS = [
    ("logits must have shape \\(rows, classes\\)", lambda: (_t(4), _target(4), None)),
    ("logits must have shape \\(rows, classes\\)", lambda: (_t(4, 0), _target(4), None)),
    ("logits must be float32", lambda: (_t(4, 3, dtype=torch.int32), _target(4), None)),
    ("target must be int64 or int32", lambda: (_t(4, 3), _t(4), None)),
    ("target must have shape \\(4,\\)", lambda: (_t(4, 3), _target(5), None)),
    ("weight must have shape \\(3,\\)", lambda: (_t(4, 3), _target(4), _t(4))),
    ("weight must be float32", lambda: (_t(4, 3), _target(4), _t(3, dtype=torch.int64))),
    ("target is on", lambda: (_t(4, 3), torch.zeros(4, dtype=torch.long, device="meta"), None)),
]


@pytest.mark.parametrize(("message", "make_args"), BAD_CALLS)
def test_bad_input_raises_clear_error(message, make_args):
    with pytest.raises((ValueError, TypeError), match=message):
        torch.ops.liger.cross_entropy(*make_args())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"reduction": "avg"}, "reduction must be one of"),
        ({"label_smoothing": 1.5}, "label_smoothing must be in"),
        ({"softcap": 0.0}, "softcap must be None or a finite number > 0"),
        ({"lse_square_scale": float("nan")}, "lse_square_scale must be finite"),
    ],
)
def test_bad_options_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        torch.ops.liger.cross_entropy(_t(2, 3), _target(2), **kwargs)


OPCHECK_CASES = [
    ((7, 48), torch.float32, Options()),
    ((5, 33), torch.bfloat16, Options(IGNORE, 0.1, "sum", 1e-3, 10.0)),
    ((3, 17), torch.float16, Options(0, 0.0, "none", 0.0, None)),
]


@pytest.mark.parametrize(("shape", "dtype", "o"), OPCHECK_CASES)
def test_opcheck(shape, dtype, o):
    logits = torch.randn(shape, dtype=dtype, device=DEVICE, requires_grad=True)
    target = make_target(shape[0], shape[1], 0.3, o.ignore_index)
    weight = torch.rand(shape[1], device=DEVICE)
    torch.library.opcheck(torch.ops.liger.cross_entropy.default, (logits, target, weight, *o),
                          test_utils=OPCHECK_UTILS)  # fmt: skip
    _, _, lse = torch.ops.liger.cross_entropy(logits.detach(), target, weight, *o)
    grad_loss = torch.randn(shape[0] if o.reduction == "none" else (), device=DEVICE)
    torch.library.opcheck(torch.ops.liger.cross_entropy_backward.default,
                          (grad_loss, logits.detach(), target, lse, weight, *o), test_utils=OPCHECK_UTILS)  # fmt: skip


def test_compile_fullgraph_matches_eager():
    def model(x, target):
        return torch.ops.liger.cross_entropy(x * 2.0, target, None, IGNORE, 0.1)[0]

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(6, 40, device=DEVICE, requires_grad=True)
    target = make_counted_target(6, 40, 0.3)
    out = compiled(x, target)
    torch.testing.assert_close(out, model(x, target))
    torch.testing.assert_close(torch.autograd.grad(out, x)[0], torch.autograd.grad(model(x, target), x)[0])


def test_torch_func_grad_jvp_vmap_and_hessian_match_the_reference():
    x = torch.randn(4, 7, dtype=torch.float64, device=DEVICE)
    target = torch.tensor([1, IGNORE, 3, 6], device=DEVICE)
    o = Options(IGNORE, 0.1, "mean", 1e-2, 4.0)

    def ours(x):
        return torch.ops.liger.cross_entropy(x, target, None, *o)[0]

    def ref(x):
        return reference.forward(x, target, None, o)[0]

    tangent = torch.randn_like(x)
    torch.testing.assert_close(torch.func.jvp(ours, (x,), (tangent,))[1], torch.func.jvp(ref, (x,), (tangent,))[1])
    torch.testing.assert_close(torch.func.grad(ours)(x), torch.func.grad(ref)(x))
    torch.testing.assert_close(torch.func.hessian(ours)(x), torch.func.hessian(ref)(x))
    batch = torch.randn(3, 4, 7, dtype=torch.float64, device=DEVICE)
    torch.testing.assert_close(torch.vmap(ours)(batch), torch.stack([ref(b) for b in batch]))
