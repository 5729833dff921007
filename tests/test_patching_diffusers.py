"""apply_liger_ops on diffusers models (tiny configs): every nn.GroupNorm
swapped, each ResnetBlock2D's norm -> SiLU pairs routed through the fused
op, every GEGLU through geglu_exact, outputs and gradients equal to the
unpatched model's, and remove() restoring the blocks.  Skipped without diffusers."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from liger_nn import apply_liger_ops, diffusers_blocks
from tests.helpers import DEVICE

diffusers = pytest.importorskip("diffusers")
DIFFUSERS_GEGLU = pytest.importorskip("diffusers.models.activations").GEGLU


class FusedCallCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts liger.group_norm calls by activation."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = {"none": 0, "silu": 0}
        self.geglu_exact = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket is torch.ops.liger.group_norm:
            self.calls[kwargs.get("activation", "none")] += 1
        self.geglu_exact += func.overloadpacket is torch.ops.liger.geglu_exact
        return func(*args, **kwargs)


# One level each (the interpreter runs every GroupNorm launch in Python): down, mid and up ResNet blocks.
def _unet_scale_shift():
    return diffusers.UNet2DModel(
        sample_size=8, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8,),
        down_block_types=("DownBlock2D",), up_block_types=("UpBlock2D",), norm_num_groups=4,
        resnet_time_scale_shift="scale_shift", add_attention=False,
    )  # fmt: skip


def _cond_unet(cls=None):
    return (cls or diffusers.UNet2DConditionModel)(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8,),
        down_block_types=("CrossAttnDownBlock2D",), up_block_types=("CrossAttnUpBlock2D",),
        norm_num_groups=4, cross_attention_dim=8, attention_head_dim=4,
    )  # fmt: skip


def _vae():
    return diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",),
        block_out_channels=(8,), layers_per_block=1, latent_channels=4, norm_num_groups=4, sample_size=8,
    )  # fmt: skip


def _inputs(name, gen):
    if name == "vae":
        return (torch.randn(2, 3, 8, 8, generator=gen),), {}
    if name == "cond_unet":
        return (torch.randn(2, 4, 8, 8, generator=gen), torch.tensor([3, 500])), {
            "encoder_hidden_states": torch.randn(2, 5, 8, generator=gen)
        }
    return (torch.randn(2, 3, 8, 8, generator=gen), torch.tensor([3, 500])), {}


def _output(model, args, kwargs):
    out = model(*args, **kwargs)
    return out.sample if hasattr(out, "sample") else out[0]


MODELS = {"unet_scale_shift": _unet_scale_shift, "cond_unet": _cond_unet, "vae": _vae}


@pytest.mark.parametrize("name", list(MODELS))
def test_patched_diffusers_model_matches_unpatched(name):
    torch.manual_seed(0)
    model = MODELS[name]().to(DEVICE)
    if name == "vae":  # sample() draws from the posterior: compare the mean path
        model.forward = lambda x: model.decode(model.encode(x).latent_dist.mode())
    ref = copy.deepcopy(model)
    n_group_norms = sum(type(m) is nn.GroupNorm for m in model.modules())
    blocks = [m for m in model.modules() if diffusers_blocks.is_resnet_block(m)]
    geglus = [m for m in model.modules() if type(m) is DIFFUSERS_GEGLU]
    assert (name == "cond_unet") == bool(geglus)
    patch = apply_liger_ops(model)
    assert patch.report.count("group_norm") == n_group_norms
    assert sum("-> liger_nn.GEGLU" in r.detail for r in patch.report.replaced) == len(geglus)
    assert not any(type(m) is nn.GroupNorm for m in model.modules())
    assert patch.report.count("group_norm_silu") == len(blocks) > 0
    pairs = sum(len(diffusers_blocks.fused_pairs(b)) for b in blocks)
    assert pairs == (1 if name == "unet_scale_shift" else 2) * len(blocks)

    args, kwargs = _inputs(name, torch.Generator().manual_seed(1))
    args = tuple(a.to(DEVICE) for a in args)
    kwargs = {k: v.to(DEVICE) for k, v in kwargs.items()}
    with FusedCallCounter() as counter:
        out = _output(model, args, kwargs)
    assert counter.calls["silu"] == pairs
    assert counter.geglu_exact == len(geglus)
    expected = _output(ref, args, kwargs)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    for (pname, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        if q.grad is not None:  # float32 sums in another order: relative to the gradient's norm
            assert (p.grad - q.grad).norm() <= 1e-4 * q.grad.norm(), pname

    patch.remove()
    assert not any("forward" in b.__dict__ for b in blocks)
    assert sum(type(m) is nn.GroupNorm for m in model.modules()) == n_group_norms
    assert [m for m in model.modules() if type(m) is DIFFUSERS_GEGLU] == geglus


def test_a_geglu_class_whose_forward_differs_is_left_alone(monkeypatch):
    """The patch-time check compares with the class's own forward, once per class (diffusers' torch_npu
    branch takes the tanh GELU)."""
    monkeypatch.setattr(DIFFUSERS_GEGLU, "gelu", lambda self, g: nn.functional.gelu(g, approximate="tanh"))
    model = _cond_unet()
    n = sum(type(m) is DIFFUSERS_GEGLU for m in model.modules())
    patch = apply_liger_ops(model)
    reasons = [r.detail for r in patch.report.left_alone if r.kind == "glu"]
    assert len(reasons) == n > 0 and all("differs" in r for r in reasons)
    assert not any("GEGLU" in r.detail for r in patch.report.replaced)
    patch.remove()


def test_blocks_left_alone_are_reported(monkeypatch):
    model = _cond_unet()
    block = next(m for m in model.modules() if diffusers_blocks.is_resnet_block(m))
    block.nonlinearity = nn.GELU()
    monkeypatch.setattr(diffusers_blocks, "fused_resnet_forward", lambda self, x, temb: x)  # a forward that differs
    patch = apply_liger_ops(model)
    reasons = [r.detail for r in patch.report.left_alone if r.kind == "group_norm_silu"]
    assert any("not SiLU" in r for r in reasons)
    assert any("differs" in r for r in reasons)
    assert patch.report.count("group_norm_silu") == 0
    patch.remove()


def test_layer_norms_of_a_diffusers_model_are_left_to_torch_unless_asked_for():
    model = _cond_unet()
    originals = sorted(name for name, m in model.named_modules() if type(m) is nn.LayerNorm)
    assert originals
    patch = apply_liger_ops(model)
    left = [r for r in patch.report.left_alone if r.kind == "layer_norm"]
    assert sorted(r.target for r in left) == originals and all("layer_norm=True" in r.detail for r in left)
    assert patch.report.count("layer_norm") == 0
    patch.remove()
    patch = apply_liger_ops(model, layer_norm=True)
    assert sorted(r.target for r in patch.report.replaced if r.kind == "layer_norm") == originals
    assert not any(type(m) is nn.LayerNorm for m in model.modules())
    patch.remove()
    assert sorted(name for name, m in model.named_modules() if type(m) is nn.LayerNorm) == originals


def test_only_the_layer_norms_inside_a_diffusers_module_are_left_to_torch():
    """A wrapper holding a UNet (a subclass of diffusers' class) beside a LayerNorm of its own."""

    class MyUNet(diffusers.UNet2DConditionModel):
        pass

    wrapper = nn.ModuleDict({"unet": _cond_unet(MyUNet), "head_norm": nn.LayerNorm(8)})
    inside = sorted(f"unet.{name}" for name, m in wrapper["unet"].named_modules() if type(m) is nn.LayerNorm)
    patch = apply_liger_ops(wrapper)
    assert sorted(r.target for r in patch.report.left_alone if r.kind == "layer_norm") == inside
    assert [r.target for r in patch.report.replaced if r.kind == "layer_norm"] == ["head_norm"]
    patch.remove()


def test_switched_off():
    model = _cond_unet()
    patch = apply_liger_ops(model, group_norm_silu=False, glu=False)
    assert patch.report.count("group_norm_silu") == 0 and patch.report.count("group_norm") > 0
    assert patch.report.count("glu") == 0
    assert not any("forward" in m.__dict__ for m in model.modules())
