"""liger_nn.hub: kernels' ``kernelize`` picks torch.ops.liger.rope for
transformers' ``"rotary_pos_emb"`` function layers, checks each function
first, and leaves (and warns about) one that computes something else."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from torch import nn

import liger_nn
import liger_nn.hub
from tests.helpers import LigerOpCounter


@pytest.fixture
def kernels():
    kernels = pytest.importorskip("kernels")
    with kernels.use_kernel_mapping({}, inherit_mapping=False):  # nothing registered leaks out of a test
        yield kernels


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert torch.isfinite(a).all() and torch.isfinite(b).all(), "non-finite values"
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _restore(kernels, model: nn.Module) -> None:
    """kernelize with no mapping: every decorated function back to its own forward."""
    with kernels.use_kernel_mapping({}, inherit_mapping=False), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # kernels: "No kernel mapping found for layer ..." (a warning or a log line)
        kernels.kernelize(model, mode=kernels.Mode.TRAINING, device="cpu")


def test_kernelize_routes_transformers_rotary_through_the_op(kernels):
    transformers = pytest.importorskip("transformers")
    modeling = transformers.models.llama.modeling_llama
    if not liger_nn.patching.hub_function(modeling.apply_rotary_pos_emb):
        pytest.skip("this transformers does not decorate apply_rotary_pos_emb with the kernels hub")
    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").train()
    ids = torch.randint(0, 32, (2, 5), generator=torch.Generator().manual_seed(1))
    want = model(input_ids=ids).logits.detach()

    liger_nn.hub.use_liger_kernels()
    assert liger_nn.hub.check_rotary_functions()[f"{modeling.__name__}.apply_rotary_pos_emb"] is True
    kernels.kernelize(model, mode=kernels.Mode.TRAINING, device="cpu")
    try:
        with LigerOpCounter() as counter:
            got = model(input_ids=ids).logits
            got.square().mean().backward()
        assert counter.calls == {"rope": 2, "rope_backward": 2}, counter.calls
        assert _rel(got, want) <= 1e-5
    finally:
        _restore(kernels, model)
    with LigerOpCounter() as counter, torch.no_grad():
        model(input_ids=ids)
    assert counter.calls == {}, "kernelize without the mapping restores the original"


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _attention_with(kernels, function):
    """A module calling a "rotary_pos_emb" function layer, as transformers' attention does."""
    rotary = kernels.use_kernel_forward_from_hub("rotary_pos_emb")(function)

    @kernels.use_kernelized_func(rotary)
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)

        def forward(self, q, k, cos, sin):
            return rotary(self.proj(q), k, cos, sin)

    return Attention(), rotary


def _inputs():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 3, 4, generator=gen), torch.randn(1, 1, 3, 4, generator=gen)
    return q, k, torch.randn(1, 3, 4, generator=gen), torch.randn(1, 3, 4, generator=gen)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """HF's rotary function (transformers' modeling files), for kernelize to match."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _kernelized_hf_attention(kernels):
    """(an attention layer whose rotary is HF's, kernelized with our mapping; its output before)."""
    model, _ = _attention_with(kernels, apply_rotary_pos_emb)
    want = model(*_inputs())
    with kernels.use_kernel_mapping(liger_nn.hub.kernel_mapping()):
        kernels.kernelize(model, mode=kernels.Mode.TRAINING | kernels.Mode.TORCH_COMPILE)
    return model, want


def test_kernelize_routes_a_matching_function_layer(kernels):
    model, want = _kernelized_hf_attention(kernels)
    model(*_inputs())  # the first call checks the function (the check runs the op too)
    with LigerOpCounter() as counter:
        got = model(*_inputs())
    assert counter.calls == {"rope": 1}
    for g, w in zip(got, want, strict=True):
        assert _rel(g, w) <= 1e-5


@pytest.mark.parametrize("kind", ["formula", "signature"])
def test_kernelize_leaves_and_warns_about_a_function_of_another_kind(kernels, kind):
    def cos_only(q, k, cos, sin, unsqueeze_dim=1):  # the right parameters, another formula
        return q * cos.unsqueeze(unsqueeze_dim), k * cos.unsqueeze(unsqueeze_dim)

    def with_position_ids(q, k, cos, sin, position_ids=None):  # another fifth parameter
        return q * cos.unsqueeze(1), k * cos.unsqueeze(1)

    model, rotary = _attention_with(kernels, cos_only if kind == "formula" else with_position_ids)
    want = model(*_inputs())
    with kernels.use_kernel_mapping(liger_nn.hub.kernel_mapping()):
        kernels.kernelize(model, mode=kernels.Mode.TRAINING)
    reason = "differs" if kind == "formula" else "position_ids"
    with pytest.warns(liger_nn.LigerPatchWarning, match=f"keeps its own code under kernelize.*{reason}"):
        model(*_inputs())  # the first call checks the function
    with LigerOpCounter() as counter:
        got = model(*_inputs())
    assert counter.calls == {}
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    assert liger_nn.hub._VERDICTS[type(rotary)] is False


def test_use_liger_kernels_without_kernels_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "kernels", None)
    with pytest.raises(ImportError, match="needs the `kernels` package"):
        liger_nn.hub.use_liger_kernels()


def test_kernelized_layer_is_captured_whole_by_torch_compile(kernels):
    """After the check (here: the first eager call), dynamo captures the op in one graph."""

    model, want = _kernelized_hf_attention(kernels)
    model(*_inputs())
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    got = torch.compile(model, backend=backend, fullgraph=True)(*_inputs())
    # The layer calls the op through eager_call, which under compile calls the overload (liger.rope.default).
    ops = [str(n.target).removesuffix(".default") for n in graphs[0].graph.nodes if "liger" in str(n.target)]
    assert ops == ["liger.rope"]
    for g, w in zip(got, want, strict=True):
        assert _rel(g, w) <= 1e-5
