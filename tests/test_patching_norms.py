"""apply_liger_ops' RMSNorm and LayerNorm swaps (liger_nn/patching/swap_rms_norm.py,
swap_layer_norm.py): each transformers RMSNorm class gets the convention its own
bfloat16 output shows (Llama's, Gemma's 1 + weight, OLMo2's float32 weight;
Qwen3's per-head q/k norms too), tiny float64 models train with the same
losses, gradients and parameters as the model as is, remove() restores the
originals, and look-alikes the swaps cannot take are reported, not touched."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from liger_nn import LayerNorm, RMSNorm, apply_liger_ops
from tests.helpers import DEVICE, LigerOpCounter
from tests.test_e2e_training import _CONFIG_KWARGS, LAYERS, STEPS, assert_same_float64_training, train

transformers = pytest.importorskip("transformers")

# arch -> (config class, RMSNorm class, offset, casting mode, RMSNorms per decoder layer)
RMS_ARCHS = {
    "llama": ("LlamaConfig", "LlamaRMSNorm", 0.0, "llama", 2),
    "qwen3": ("Qwen3Config", "Qwen3RMSNorm", 0.0, "llama", 4),  # input, post-attention, q_norm, k_norm
    "gemma": ("GemmaConfig", "GemmaRMSNorm", 1.0, "gemma", 2),
    "olmo2": ("Olmo2Config", "Olmo2RMSNorm", 0.0, "gemma", 4),  # post-attention, post-feedforward, q_norm, k_norm
}


class Float64RMSNorm(nn.Module):
    """An RMSNorm class's math in x's dtype: transformers' classes compute in
    float32 even for float64 x, so the model as is gets this one instead."""

    def __init__(self, weight: nn.Parameter, eps: float, offset: float) -> None:
        super().__init__()
        self.weight, self.eps, self.offset = weight, eps, offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (self.offset + self.weight)


def tiny_float64(config_name: str) -> nn.Module:
    config = getattr(transformers, config_name)(**_CONFIG_KWARGS)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # configs' token ids outside the tiny vocabulary
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return model.to(DEVICE, torch.float64).train()


def rms_norms(model: nn.Module, class_name: str) -> dict[str, nn.Module]:
    return {name: m for name, m in model.named_modules() if type(m).__name__ == class_name}


def in_float64(model: nn.Module, class_name: str, offset: float) -> nn.Module:
    """A copy of ``model`` whose RMSNorms compute in float64 (Float64RMSNorm)."""
    model = copy.deepcopy(model)
    for name, m in rms_norms(model, class_name).items():
        eps = getattr(m, "variance_epsilon", getattr(m, "eps", None))
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, Float64RMSNorm(m.weight, eps, offset))
    return model


@pytest.mark.parametrize("arch", sorted(RMS_ARCHS))
def test_patched_rms_norms_train_like_the_model_as_is_in_float64(arch):
    config_name, cls, offset, casting_mode, per_layer = RMS_ARCHS[arch]
    model = tiny_float64(config_name)
    want = train(in_float64(model, cls, offset))
    originals = rms_norms(model, cls)
    assert len(originals) == per_layer * LAYERS + 1  # and the final norm
    with apply_liger_ops(model, rope=False, glu=False, fused_linear_cross_entropy=False) as patch:
        swapped = {r.target: r.detail for r in patch.report.replaced if r.kind == "rms_norm"}
        detail = f"{cls} (offset={offset}, casting_mode={casting_mode!r})"
        assert swapped == dict.fromkeys(originals, detail), str(patch.report)
        for name, old in originals.items():
            new = model.get_submodule(name)
            assert type(new) is RMSNorm and new.weight is old.weight  # the same Parameter
        with LigerOpCounter() as counter:
            got = train(model)
    assert counter.calls == {"rms_norm": STEPS * len(originals), "rms_norm_backward": STEPS * len(originals)}
    assert all(model.get_submodule(name) is old for name, old in originals.items())  # removed
    assert_same_float64_training(got, want)


def test_patched_layer_norms_train_like_the_model_as_is_in_float64():
    model = tiny_float64("GPTNeoXConfig")
    want = train(copy.deepcopy(model))
    originals = {name: m for name, m in model.named_modules() if type(m) is nn.LayerNorm}
    assert len(originals) == 2 * LAYERS + 1
    with apply_liger_ops(model, rope=False, glu=False, fused_linear_cross_entropy=False) as patch:
        assert sorted(r.target for r in patch.report.replaced if r.kind == "layer_norm") == sorted(originals)
        assert all(type(model.get_submodule(name)) is LayerNorm for name in originals)
        with LigerOpCounter() as counter:
            got = train(model)
    n = STEPS * len(originals)
    assert counter.calls == {"layer_norm": n, "layer_norm_backward": n}, counter.calls
    assert all(model.get_submodule(name) is old for name, old in originals.items())
    assert_same_float64_training(got, want)


class NotAnRMSNorm(nn.Module):
    """Named like one, but scales without normalising: no convention reproduces it."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(8))
        self.eps = 1e-6

    def forward(self, x):
        return x * self.weight


NotAnRMSNorm.__name__ = NotAnRMSNorm.__qualname__ = "ScaleOnlyRMSNorm"


class ShiftedLayerNorm(nn.LayerNorm):
    def forward(self, x):
        return super().forward(x) + 1.0


def test_norms_the_swaps_cannot_take_are_reported_and_left_alone():
    net = nn.ModuleDict(
        {
            "scale_only": NotAnRMSNorm(),
            "no_eps": nn.RMSNorm(8),  # eps=None: the input dtype's machine epsilon
            "shifted": ShiftedLayerNorm(8),
            "plain": nn.RMSNorm(8, eps=1e-5),
        }
    )
    with apply_liger_ops(net, rope=False) as patch:
        left = {r.target: r.detail for r in patch.report.left_alone}
        assert "no offset and casting mode" in left["scale_only"]
        assert "eps is None, not a float" in left["no_eps"]
        assert "subclasses nn.LayerNorm" in left["shifted"]
        assert [r.target for r in patch.report.replaced] == ["plain"]
        assert type(net["plain"]) is RMSNorm and type(net["scale_only"]) is NotAnRMSNorm
    assert type(net["plain"]) is nn.RMSNorm
    with apply_liger_ops(net, rope=False, rms_norm=False, layer_norm=False) as patch:
        assert not patch.report.replaced
