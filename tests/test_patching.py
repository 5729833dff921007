"""apply_liger_ops: what it replaces, what it leaves alone, what it reports,
and that remove() puts everything back."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from torch import nn

import liger_nn
from liger_nn import apply_liger_ops
from liger_nn.patching import rope_patched_modules
from tests.helpers import DEVICE


class MotifPolyNorm(nn.Module):
    """The PolyCom formula, written as a model would."""

    def __init__(self, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor([0.5, -0.3, 0.8]))
        self.bias = nn.Parameter(torch.tensor([0.1]))
        self.eps = eps

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        w = self.weight
        return w[0] * self._norm(x**3) + w[1] * self._norm(x**2) + w[2] * self._norm(x) + self.bias


class CenteredPolyNorm(MotifPolyNorm):
    """Right shapes and name, different formula: the patch-time check must refuse it."""

    def _norm(self, x):
        x = x - x.mean(-1, keepdim=True)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class WidePolyNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))
        self.bias = nn.Parameter(torch.zeros(1))
        self.eps = 1e-6

    def forward(self, x):
        return x * self.weight.sum() + self.bias


class MyGroupNorm(nn.GroupNorm):
    pass


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)  # a bias before a norm gets a ~0 gradient
        self.gn = nn.GroupNorm(4, 8)
        self.blocks = nn.ModuleList([nn.GroupNorm(2, 8, affine=False), nn.GroupNorm(8, 8)])
        self.blocks[1].register_parameter("bias", None)  # torch 2.11 has no GroupNorm(bias=False)
        self.act = MotifPolyNorm()
        self.centered = CenteredPolyNorm()
        self.wide = WidePolyNorm()
        self.sub = MyGroupNorm(2, 8)
        self.head = nn.Linear(8 * 5 * 5, 4)

    def forward(self, x):
        # Parallel branches: a norm right behind another would scale its gradients away.
        x = self.conv(x)
        y = self.gn(x) + torch.tanh(self.blocks[0](x)) * self.blocks[1](x) + self.sub(x)
        h = y.flatten(1)
        return self.head(self.act(h) + self.centered(h) + self.wide(h))


def _net() -> Net:
    torch.manual_seed(0)
    net = Net().to(DEVICE)
    with torch.no_grad():  # non-trivial affine parameters
        for module in net.modules():
            if isinstance(module, nn.GroupNorm) and module.affine:
                module.weight.uniform_(0.5, 1.5)
                if module.bias is not None:
                    module.bias.uniform_(-0.5, 0.5)
    return net


def _inputs(seed: int = 1) -> torch.Tensor:
    return torch.randn(2, 3, 5, 5, generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert torch.isfinite(a).all() and torch.isfinite(b).all(), "non-finite values"
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_module_swaps_report_and_shared_parameters():
    net = _net()
    params_before = dict(net.named_parameters())
    keys_before = list(net.state_dict())
    originals = {name: net.get_submodule(name) for name in ("gn", "blocks.0", "blocks.1", "act")}

    patch = apply_liger_ops(net)
    report = patch.report
    replaced = {(r.kind, r.target) for r in report.replaced}
    assert replaced == {
        ("group_norm", "gn"),
        ("group_norm", "blocks.0"),
        ("group_norm", "blocks.1"),
        ("poly_norm", "act"),
    }, str(report)
    left = {(r.kind, r.target): r.detail for r in report.left_alone}
    assert left.keys() == {("group_norm", "sub"), ("poly_norm", "centered"), ("poly_norm", "wide")}, str(report)
    assert "subclasses nn.GroupNorm" in left["group_norm", "sub"]
    assert "differs" in left["poly_norm", "centered"]
    assert "weight (3,)" in left["poly_norm", "wide"]
    assert report.count("group_norm") == 3 and report.rope_modules == []

    assert type(net.gn) is liger_nn.GroupNorm and type(net.blocks[0]) is liger_nn.GroupNorm
    assert type(net.act) is liger_nn.PolyNorm and type(net.sub) is MyGroupNorm
    assert net.blocks[0].weight is None and net.blocks[1].bias is None and net.blocks[1].weight is not None
    # The very same Parameter objects, so state_dict keys and optimizers are unaffected.
    for name, param in net.named_parameters():
        assert param is params_before[name], name
    assert list(net.state_dict()) == keys_before

    patch.remove()
    for name, module in originals.items():
        assert net.get_submodule(name) is module
    assert not patch.active
    patch.remove()  # idempotent


def test_patched_training_matches_and_optimizer_built_before_patch_works():
    """Two SGD steps: the optimizer is created before patching; patched and
    unpatched copies stay equal (loss, every gradient, every parameter)."""
    ref = _net()
    net = copy.deepcopy(ref)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    start = {n: p.detach().clone() for n, p in net.named_parameters()}
    with apply_liger_ops(net):
        for step in range(2):
            x = _inputs(step)
            loss, ref_loss = net(x).square().mean(), ref(x).square().mean()
            assert _rel(loss, ref_loss) <= 1e-5, f"step {step}: {loss.item()} vs {ref_loss.item()}"
            loss.backward()
            ref_loss.backward()
            for (name, p), ref_p in zip(net.named_parameters(), ref.parameters(), strict=True):
                assert _rel(p.grad, ref_p.grad) <= 1e-4, f"step {step}: grad of {name}"
            opt.step()
            ref_opt.step()
            opt.zero_grad()
            ref_opt.zero_grad()
    # After remove() the original modules carry the trained parameters.
    assert type(net.gn) is nn.GroupNorm
    for (name, p), ref_p in zip(net.named_parameters(), ref.parameters(), strict=True):
        assert _rel(p, ref_p) <= 1e-4, name
    assert not torch.equal(net.gn.weight, start["gn.weight"]) and not torch.equal(net.act.weight, start["act.weight"])


def test_switches_and_bad_argument():
    net = _net()
    with apply_liger_ops(net, group_norm=False) as patch:
        assert {r.kind for r in patch.report.replaced} == {"poly_norm"}
        assert type(net.gn) is nn.GroupNorm
    with apply_liger_ops(net, poly_norm=False) as patch:
        assert {r.kind for r in patch.report.replaced} == {"group_norm"}
        assert type(net.act) is MotifPolyNorm
    with pytest.raises(TypeError, match="nn.Module"):
        apply_liger_ops(lambda x: x)


# --- the rotary swap in transformers modeling modules ----------------------


@pytest.fixture
def hf():
    transformers = pytest.importorskip("transformers")
    assert rope_patched_modules() == {}, "a previous test leaked a rotary patch"
    yield transformers
    assert rope_patched_modules() == {}, "this test leaked a rotary patch"


def _llama(transformers):
    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")


def test_rope_swap_is_reference_counted_and_restored(hf):
    modeling = hf.models.llama.modeling_llama
    original = modeling.apply_rotary_pos_emb
    first = apply_liger_ops(_llama(hf))
    assert first.report.rope_modules == [modeling.__name__]
    patched = modeling.apply_rotary_pos_emb
    assert patched is not original and patched.__liger_original__ is original
    assert inspect.signature(patched) == inspect.signature(original)
    with apply_liger_ops(_llama(hf)) as second:
        assert modeling.apply_rotary_pos_emb is patched
        assert rope_patched_modules() == {modeling.__name__: 2}
        assert second.report.rope_modules == [modeling.__name__]
    assert modeling.apply_rotary_pos_emb is patched, "released while the first model still holds it"
    first.remove()
    assert modeling.apply_rotary_pos_emb is original


def test_rope_adapter_layouts_and_table_dtype(hf):
    modeling = hf.models.llama.modeling_llama
    original = modeling.apply_rotary_pos_emb
    with apply_liger_ops(_llama(hf)):
        patched = modeling.apply_rotary_pos_emb
        gen = torch.Generator().manual_seed(0)
        q, k = (torch.randn(2, 3, 4, 8, generator=gen).to(DEVICE) for _ in range(2))
        cos, sin = (torch.randn(2, 4, 8, generator=gen).to(DEVICE) for _ in range(2))
        for args, kwargs in (
            ((q, k, cos, sin), {}),
            ((q.transpose(1, 2), k.transpose(1, 2), cos, sin), {"unsqueeze_dim": 2}),
        ):
            for got, want in zip(patched(*args, **kwargs), original(*args, **kwargs), strict=True):
                assert _rel(got, want) <= 1e-5
        # bf16 q/k with float32 tables (autocast): the tables are cast to q's dtype.
        q_out, _ = patched(q.bfloat16(), k.bfloat16(), cos, sin)
        assert q_out.dtype == torch.bfloat16
        assert _rel(q_out.float(), original(q, k, cos, sin)[0]) <= 2e-2


def test_rope_left_alone_outside_allow_list_or_when_check_fails(hf, monkeypatch):
    modeling = hf.models.llama.modeling_llama
    model = _llama(hf)
    with apply_liger_ops(model, rope_architectures=()) as patch:
        assert patch.report.replaced == []
        assert [r.target for r in patch.report.left_alone] == [modeling.__name__]
        assert "allow-list" in patch.report.left_alone[0].detail
    with apply_liger_ops(model, rope=False) as patch:
        assert patch.report.replaced == [] and patch.report.left_alone == []

    def cos_only(q, k, cos, sin, unsqueeze_dim=1):  # right signature, other formula
        return q * cos.unsqueeze(unsqueeze_dim), k * cos.unsqueeze(unsqueeze_dim)

    def other_signature(q, k, cos, sin, rotary_dim):
        return q, k

    for fake, reason in ((cos_only, "differs"), (other_signature, "signature")):
        monkeypatch.setattr(modeling, "apply_rotary_pos_emb", fake)
        with apply_liger_ops(model) as patch:
            assert patch.report.rope_modules == []
            assert reason in patch.report.left_alone[0].detail, str(patch.report)
            assert modeling.apply_rotary_pos_emb is fake


def test_rope_remove_keeps_a_later_foreign_patch(hf, monkeypatch):
    modeling = hf.models.llama.modeling_llama
    original = modeling.apply_rotary_pos_emb
    patch = apply_liger_ops(_llama(hf))
    foreign = lambda q, k, cos, sin, unsqueeze_dim=1: (q, k)
    modeling.apply_rotary_pos_emb = foreign
    try:
        with pytest.warns(UserWarning, match="replaced by someone else"):
            patch.remove()
        assert modeling.apply_rotary_pos_emb is foreign
    finally:
        modeling.apply_rotary_pos_emb = original
