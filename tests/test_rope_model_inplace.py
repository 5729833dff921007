"""The in-place path of liger_nn's rotary functions: when it is taken
(``liger_nn.rope.rotates_in_place``) and that it gives the out-of-place
path's values and gradients, in float64, eagerly and compiled, on q and k as
transformers hands them over (views of the projections' (B, S, H, D)
memory).  On a CUDA machine the same tests run on the GPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import liger_nn
from bench.providers import hf_apply_rotary_pos_emb
from liger_nn import hf_rotary
from liger_nn.rope import rotates_in_place
from tests.helpers import DEVICE, assert_close_to_ref
from tests.rope_cases import hf_tables

B, S, HQ, HK, D, HIDDEN = 2, 5, 4, 2, 8, 16


class _RMSNorm(nn.Module):
    """transformers' RMSNorm (Qwen3's q_norm / k_norm): weight * normalized, in plain ops.  Not
    torch.nn.RMSNorm, which on CUDA is one fused op whose node is not a producer rope_ may
    overwrite (so the in-place path is rightly not taken there)."""

    def __init__(self, d: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d, dtype=dtype, device=DEVICE))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))


class Attention(nn.Module):
    """The first half of a Llama attention block: projections viewed as
    (B, S, H, D), transposed to (B, H, S, D), rotated; q_norm/k_norm as Qwen3."""

    def __init__(self, bias=False, qk_norm=False, fused=False, dtype=torch.float64):
        super().__init__()
        kw = dict(bias=bias, dtype=dtype, device=DEVICE)
        self.fused = fused
        if fused:
            self.qkv = nn.Linear(HIDDEN, (HQ + 2 * HK) * D, **kw)
        else:
            self.q_proj = nn.Linear(HIDDEN, HQ * D, **kw)
            self.k_proj = nn.Linear(HIDDEN, HK * D, **kw)
            self.v_proj = nn.Linear(HIDDEN, HK * D, **kw)
        self.q_norm = _RMSNorm(D, dtype) if qk_norm else None
        self.k_norm = _RMSNorm(D, dtype) if qk_norm else None

    def projections(self, x):
        if self.fused:
            qkv = self.qkv(x)
            q, k, v = qkv[..., : HQ * D], qkv[..., HQ * D : (HQ + HK) * D], qkv[..., (HQ + HK) * D :]
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k, v = q.view(B, S, HQ, D), k.view(B, S, HK, D), v.view(B, S, HK, D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x, cos, sin, rotary=liger_nn.apply_rotary_pos_emb):
        q, k, v = self.projections(x)
        q, k = rotary(q, k, cos, sin)
        scores = q @ k.repeat_interleave(HQ // HK, dim=1).transpose(-1, -2)
        return scores.softmax(-1) @ v.repeat_interleave(HQ // HK, dim=1)


def _tables(dtype=torch.float64):
    return hf_tables(B, S, D, dtype)


def _in_place(module, x) -> bool:
    q, k, _ = module.projections(x)
    return rotates_in_place(q, k)


# --- when the in-place path is taken


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk_norm"])
def test_projections_of_a_training_step_rotate_in_place(bias, qk_norm):
    module = Attention(bias=bias, qk_norm=qk_norm)
    x = torch.randn(B, S, HIDDEN, dtype=torch.float64, device=DEVICE)
    assert _in_place(module, x)
    q, k, _ = module.projections(x)
    q_ptr, k_ptr = q.data_ptr(), k.data_ptr()
    q_out, k_out = liger_nn.apply_rotary_pos_emb(q, k, *_tables())
    assert (q_out.data_ptr(), k_out.data_ptr()) == (q_ptr, k_ptr), "the in-place path allocated outputs"


@pytest.mark.parametrize("unsqueeze_dim", [1, 2], ids=["heads_first", "seq_first"])
def test_in_place_outputs_pass_gradients_through_views(unsqueeze_dim):
    """The rotated q and k come back as views (view, permute) of the
    projections, not as_strided ones: as_strided's backward fills and copies
    a projection-sized gradient, two passes more than the rotation's."""
    module = Attention(bias=False, qk_norm=False)
    x = torch.randn(B, S, HIDDEN, dtype=torch.float64, device=DEVICE)
    q, k, _ = module.projections(x)
    if unsqueeze_dim == 2:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    shapes = (q.shape, q.stride(), k.shape, k.stride())
    q_out, k_out = liger_nn.apply_rotary_pos_emb(q, k, *_tables(), unsqueeze_dim=unsqueeze_dim)
    assert (q_out.shape, q_out.stride(), k_out.shape, k_out.stride()) == shapes
    for out in (q_out, k_out):
        names, node = [], out.grad_fn
        while node is not None and type(node).__name__ != "_RopeInPlaceBackward":
            names.append(type(node).__name__)
            node = node.next_functions[0][0]
        assert node is not None, "the in-place path was not taken"
        assert all(n in ("ViewBackward0", "PermuteBackward0", "TransposeBackward0") for n in names), names


def _leaf_views():
    q = torch.randn(B, S, HQ, D, device=DEVICE, requires_grad=True)
    k = torch.randn(B, S, HK, D, device=DEVICE, requires_grad=True)
    return q.transpose(1, 2), k.transpose(1, 2)


def _exp_produced():  # exp saves its result for backward
    q = torch.randn(B, S, HQ * D, device=DEVICE, requires_grad=True).exp().view(B, S, HQ, D)
    k = torch.randn(B, S, HK * D, device=DEVICE, requires_grad=True) * 1.0
    return q.transpose(1, 2), k.view(B, S, HK, D).transpose(1, 2)


def _split_views():  # the outputs of split: views autograd forbids modifying in place
    w = torch.randn(HIDDEN, (HQ + HK) * D, device=DEVICE, requires_grad=True)
    q, k = (torch.randn(B, S, HIDDEN, device=DEVICE) @ w).split([HQ * D, HK * D], dim=-1)
    return q.view(B, S, HQ, D).transpose(1, 2), k.view(B, S, HK, D).transpose(1, 2)


def _fused_slices():  # one QKV buffer: the backward would copy it whole
    x = torch.randn(B, S, HIDDEN, device=DEVICE)
    module = Attention(fused=True, dtype=torch.float32)
    q, k, _ = module.projections(x)
    return q, k


class _Double(torch.autograd.Function):  # a custom Function: what it keeps is not visible
    @staticmethod
    def forward(ctx, x):
        ctx.out = x * 2.0
        return ctx.out

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


def _custom_function_produced():
    w = torch.randn(B, S, HQ * D, device=DEVICE, requires_grad=True)
    k = torch.randn(B, S, HK * D, device=DEVICE, requires_grad=True) * 1.0
    return _Double.apply(w).view(B, S, HQ, D).transpose(1, 2), k.view(B, S, HK, D).transpose(1, 2)


def _k_without_grad():
    x = torch.randn(B, S, HIDDEN, device=DEVICE, requires_grad=True)
    q = (x * 1.0).repeat(1, 1, HQ * D // HIDDEN)
    k = torch.randn(B, S, HK * D, device=DEVICE) * 1.0
    return q.view(B, S, HQ, D).transpose(1, 2), k.view(B, S, HK, D).transpose(1, 2)


OUT_OF_PLACE = {
    "views of leaves": _leaf_views,
    "a producer that saves its output (exp)": _exp_produced,
    "outputs of split": _split_views,
    "slices of a fused QKV buffer": _fused_slices,
    "a custom autograd.Function's output": _custom_function_produced,
    "k not requiring grad": _k_without_grad,
}


@pytest.mark.parametrize("case", sorted(OUT_OF_PLACE))
def test_out_of_place_where_autograd_gives_no_guarantee(case):
    q, k = OUT_OF_PLACE[case]()
    assert not rotates_in_place(q, k)
    before = q.detach().clone(), k.detach().clone()
    cos, sin = _tables(torch.float32)
    q_out, k_out = liger_nn.apply_rotary_pos_emb(q, k, cos, sin)
    assert (
        q_out.data_ptr() != q.data_ptr() and torch.equal(q.detach(), before[0]) and torch.equal(k.detach(), before[1])
    )


def test_out_of_place_without_grad_mode_and_in_inference_mode():
    module = Attention()
    x = torch.randn(B, S, HIDDEN, dtype=torch.float64, device=DEVICE)
    with torch.no_grad():
        assert not _in_place(module, x)
    with torch.inference_mode():
        assert not _in_place(module, x)


def test_out_of_place_when_q_and_k_share_a_base():
    base = torch.randn(B, S, 2 * HQ * D, device=DEVICE, requires_grad=True) * 1.0
    q = base[..., : HQ * D].view(B, S, HQ, D).transpose(1, 2)
    assert not rotates_in_place(q, q)


# --- values and gradients against the out-of-place path and HF's function


def _grads(module, x, cos, sin, rotary):
    out = module(x, cos, sin, rotary)
    w = torch.randn_like(out, generator=torch.Generator(out.device).manual_seed(7))
    params = [x, *module.parameters()]
    return out.detach(), torch.autograd.grad((out * w).sum(), params)


def _out_of_place(q, k, cos, sin):
    return torch.ops.liger.rope(q, k, cos, sin)


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk_norm"])
def test_in_place_matches_the_out_of_place_path_and_hf_in_float64(bias, qk_norm):
    torch.manual_seed(0)
    module = Attention(bias=bias, qk_norm=qk_norm)
    x = torch.randn(B, S, HIDDEN, dtype=torch.float64, device=DEVICE, requires_grad=True)
    cos, sin = _tables()
    got = _grads(module, x, cos, sin, liger_nn.apply_rotary_pos_emb)
    for rotary in (_out_of_place, hf_apply_rotary_pos_emb):
        want = _grads(module, x, cos, sin, rotary)
        assert_close_to_ref(got[0], want[0], torch.float64, "attention output")
        for i, (g, w) in enumerate(zip(got[1], want[1], strict=True)):
            assert_close_to_ref(g, w, torch.float64, f"gradient {i}")


def test_in_place_matches_in_bfloat16_with_float32_tables():
    torch.manual_seed(0)
    module = Attention(dtype=torch.bfloat16)
    x = torch.randn(B, S, HIDDEN, dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
    cos, sin = _tables(torch.float32)
    got = _grads(module, x, cos, sin, liger_nn.apply_rotary_pos_emb)
    want = _grads(module, x, cos, sin, _out_of_place)
    torch.testing.assert_close(got[0], want[0])
    for g, w in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize(
    "rotary", [hf_rotary.apply_rotary_pos_emb_interleaved, hf_rotary.apply_rotary_pos_emb_glm], ids=["cohere", "glm"]
)
def test_transformers_adapters_rotate_in_place_with_the_out_of_place_gradients(rotary, monkeypatch):
    torch.manual_seed(0)
    module = Attention()
    x = torch.randn(B, S, HIDDEN, dtype=torch.float64, device=DEVICE, requires_grad=True)
    cos, sin = _tables()
    q, k, _ = module.projections(x)
    q_ptr = q.data_ptr()
    assert rotary(q, k, cos, sin)[0].data_ptr() == q_ptr
    got = _grads(module, x, cos, sin, rotary)
    monkeypatch.setattr(liger_nn.rope, "rotates_in_place", lambda q, k: False)
    want = _grads(module, x, cos, sin, rotary)
    assert_close_to_ref(got[0], want[0], torch.float64, "attention output")
    for g, w in zip(got[1], want[1], strict=True):
        assert_close_to_ref(g, w, torch.float64, "gradient")


def test_seq_first_layout_rotates_in_place(monkeypatch):
    """unsqueeze_dim=2: q and k as (B, S, H, D), not transposed."""
    torch.manual_seed(0)
    x = torch.randn(B, S, HIDDEN, dtype=torch.float64, device=DEVICE, requires_grad=True)
    w = torch.randn(HQ * D, HIDDEN, dtype=torch.float64, device=DEVICE, requires_grad=True)
    cos, sin = _tables()

    def grads(in_place):
        q = (x @ w.t()).view(B, S, HQ, D)
        k = (x @ w[: HK * D].t()).view(B, S, HK, D)
        q_out, k_out = liger_nn.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
        assert (q_out.data_ptr() == q.data_ptr()) == in_place
        return torch.autograd.grad((q_out * 2.0).sum() + k_out.square().sum(), (x, w))

    got = grads(True)
    monkeypatch.setattr(liger_nn.rope, "rotates_in_place", lambda q, k: False)
    for g, r in zip(got, grads(False), strict=True):
        assert_close_to_ref(g, r, torch.float64, "gradient")


def test_a_tensor_saved_before_the_rotation_makes_backward_raise():
    """What rotates_in_place cannot see (a consumer that saved q before the
    call) fails loudly at backward, never with a wrong gradient."""
    module = Attention()
    x = torch.randn(B, S, HIDDEN, dtype=torch.float64, device=DEVICE, requires_grad=True)
    q, k, _ = module.projections(x)
    saved = (q * q).sum()  # mul saves q
    assert rotates_in_place(q, k)
    q, k = liger_nn.apply_rotary_pos_emb(q, k, *_tables())
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (saved + q.sum() + k.sum()).backward()


def test_compiled_block_matches_eager():
    """Under torch.compile the decision is out of place (the compiler owns
    memory); rope_ called explicitly on the projections' views is rewritten
    by functionalization.  Both give eager's gradients."""
    torch.manual_seed(0)
    module = Attention()
    x = torch.randn(B, S, HIDDEN, dtype=torch.float64, device=DEVICE, requires_grad=True)
    cos, sin = _tables()
    want = _grads(module, x, cos, sin, liger_nn.apply_rotary_pos_emb)

    def explicit(q, k, cos, sin):
        torch.ops.liger.rope_(q, k, cos, sin)
        return q, k

    for rotary in (liger_nn.apply_rotary_pos_emb, explicit):
        compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
        got = _grads(compiled, x, cos, sin, rotary)
        assert_close_to_ref(got[0], want[0], torch.float64, "attention output")
        for i, (g, w) in enumerate(zip(got[1], want[1], strict=True)):
            assert_close_to_ref(g, w, torch.float64, f"gradient {i}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="peak memory of a CUDA allocation")
def test_in_place_path_allocates_no_outputs_on_cuda():
    module = Attention(dtype=torch.bfloat16)
    x = torch.randn(B, S, HIDDEN, dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
    cos, sin = _tables(torch.bfloat16)
    q, k, _ = module.projections(x)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    liger_nn.apply_rotary_pos_emb(q, k, cos, sin)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before < q.numel() * q.element_size()


def test_patched_llama_training_rotates_in_place_and_matches_unpatched(monkeypatch):
    """A transformers Llama trained 3 steps with the patch, no dispatch mode
    watching (a mode makes rotates_in_place answer False): every rotation took
    the in-place path, and losses, gradients and parameters are the unpatched
    model's (tests/test_e2e_training.py's tolerances)."""
    import copy

    e2e = pytest.importorskip("tests.test_e2e_training")
    from liger_nn import apply_liger_ops

    model = e2e.tiny_model("llama")
    want = e2e.train(copy.deepcopy(model))
    decisions = []
    decide = liger_nn.rope.rotates_in_place

    def spy(q, k):
        decisions.append(decide(q, k))
        return decisions[-1]

    with apply_liger_ops(model):  # (its patch-time checks call the rotary too)
        monkeypatch.setattr(liger_nn.rope, "rotates_in_place", spy)
        got = e2e.train(model)
    assert len(decisions) == e2e.STEPS * e2e.LAYERS and all(decisions), decisions
    e2e.assert_same_training(got, want)
