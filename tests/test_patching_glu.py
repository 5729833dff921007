"""apply_liger_ops' gated-MLP swap (liger_nn/patching/swap_glu.py): tiny
transformers models with SwiGLU (Llama, Qwen2, Mistral) and GeGLU (Gemma)
MLPs train in float64 with the same losses, gradients and parameters as the
model as is; the report names each swap, remove() restores the original
modules, and MLPs the swap cannot take are reported, not touched."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from liger_nn import GeGLUMLP, SwiGLUMLP, apply_liger_ops
from tests.helpers import DEVICE, LigerOpCounter
from tests.test_e2e_training import _CONFIG_KWARGS, LAYERS, STEPS, assert_same_float64_training, train

transformers = pytest.importorskip("transformers")

# arch -> (config class, MLP class, drop-in, op)
ARCHS = {
    "llama": ("LlamaConfig", "LlamaMLP", SwiGLUMLP, "swiglu"),
    "qwen2": ("Qwen2Config", "Qwen2MLP", SwiGLUMLP, "swiglu"),
    "mistral": ("MistralConfig", "MistralMLP", SwiGLUMLP, "swiglu"),
    "gemma": ("GemmaConfig", "GemmaMLP", GeGLUMLP, "geglu"),
}


def tiny_float64(arch: str) -> nn.Module:
    config = getattr(transformers, ARCHS[arch][0])(**_CONFIG_KWARGS)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return model.to(DEVICE, torch.float64).train()


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_patched_mlps_train_like_the_model_as_is_in_float64(arch):
    _, mlp_cls, drop_in, op = ARCHS[arch]
    model = tiny_float64(arch)
    want = train(copy.deepcopy(model))
    originals = [layer.mlp for layer in model.model.layers]
    with apply_liger_ops(model, rope=False, rms_norm=False, fused_linear_cross_entropy=False) as patch:
        glu = [r for r in patch.report.replaced if r.kind == "glu"]
        assert [(r.target, r.detail) for r in glu] == [
            (f"model.layers.{i}.mlp", f"{mlp_cls} -> {drop_in.__name__}") for i in range(LAYERS)
        ], str(patch.report)
        assert all(type(layer.mlp) is drop_in for layer in model.model.layers)
        assert model.model.layers[0].mlp.gate_proj is originals[0].gate_proj  # the same Linear modules
        with LigerOpCounter() as counter:
            got = train(model)
    assert counter.calls == {op: STEPS * LAYERS, f"{op}_backward": STEPS * LAYERS}, counter.calls
    assert [type(layer.mlp).__name__ for layer in model.model.layers] == [mlp_cls] * LAYERS  # removed
    assert all(layer.mlp is orig for layer, orig in zip(model.model.layers, originals, strict=True))
    assert_same_float64_training(got, want)


class _OtherAct(nn.Module):
    """A gated MLP whose activation the ops do not have (exact GELU)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(8, 16), nn.Linear(8, 16), nn.Linear(16, 8)
        self.act_fn = nn.GELU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class _OtherForward(_OtherAct):
    """SiLU, but not down(act(gate) * up): the patch-time check refuses it."""

    def __init__(self) -> None:
        super().__init__()
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.up_proj(x)) * self.gate_proj(x))


def test_mlps_the_swap_cannot_take_are_reported_and_left_alone():
    net = nn.ModuleDict({"gelu": _OtherAct(), "swapped_roles": _OtherForward()})
    with apply_liger_ops(net, rope=False) as patch:
        left = {r.target: r.detail for r in patch.report.left_alone if r.kind == "glu"}
        assert "neither SiLU nor tanh GELU" in left["gelu"]
        assert "differs from this class's" in left["swapped_roles"]
        assert not [r for r in patch.report.replaced if r.kind == "glu"]
    with apply_liger_ops(tiny_float64("llama"), rope=False, glu=False) as patch:
        assert not [r for r in patch.report.replaced if r.kind == "glu"]
