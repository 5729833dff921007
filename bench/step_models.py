"""The models `python -m bench.steps` trains one step of, built from their
libraries' own classes with random weights (nothing is downloaded).

Each case names its shapes; ``build(case, shape, device, dtype, tiny)``
returns the model and the batch, and ``loss(model, batch)`` is the forward
plus loss the step differentiates (what ``torch.compile`` wraps).

Sizes (the full configs; ``tiny`` shrinks every model for the CPU smoke test):

* ``unet``: diffusers ``UNet2DConditionModel(sample_size=64,
  cross_attention_dim=768)``, otherwise its defaults: SD 1.5's UNet (61
  GroupNorms), 4-channel 64x64 latents, encoder_hidden_states (B, 77, 768), a
  timestep per sample; loss = MSE of the noise prediction against a random
  noise target.
* ``vae``: diffusers ``AutoencoderKL`` with SD's VAE config (block_out_channels
  128/256/512/512, two layers per block, 4 latent channels) on a 256x256 RGB
  image; encode -> latent_dist.mode() -> decode -> MSE against the input.
* ``resnet``: 4 blocks (tiny: 1) of GroupNorm(32) -> SiLU -> Conv3x3, twice, plus skip;
  loss = mean of the output squared.
* ``llama`` / ``qwen2``: transformers LlamaForCausalLM / Qwen2ForCausalLM,
  8 layers, hidden 2048, head_dim 128, intermediate 5632, vocab 32000, SDPA
  attention; Llama with 16 query and 16 key/value heads (MHA), Qwen2 with 16
  query and 4 key/value heads (GQA); loss from ``labels=input_ids``.
* ``llama3``: ``llama`` with Llama 3's vocabulary (128256), where the logits
  are the step's largest activation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

MODELS = ("unet", "vae", "resnet", "llama", "qwen2", "llama3")
# Models whose GroupNorms the layout option (channels_last) and the upstream LigerGroupNorm swap apply to.
CONV_MODELS = ("unet", "vae", "resnet")
LLM_MODELS = ("llama", "qwen2", "llama3")
# Each LLM's transformers architecture.
LLM_ARCH = {"llama": "llama", "qwen2": "qwen2", "llama3": "llama"}


class ModelUnavailable(RuntimeError):
    """The model's library is not importable here."""


@dataclass(frozen=True)
class Case:
    model: str
    shapes: tuple[tuple[int, ...], ...]  # full-size shapes, default run
    quick: tuple[tuple[int, ...], ...]  # the --quick subset
    tiny: tuple[tuple[int, ...], ...]  # the --tiny shapes


# unet: (batch,), latents 64x64; vae: (batch, H, W); resnet: (N, C, H, W); llm: (batch, seq).
CASES = {
    "unet": Case("unet", ((4,),), ((4,),), ((2,),)),
    "vae": Case("vae", ((4, 256, 256),), ((2, 256, 256),), ((1, 16, 16),)),
    "resnet": Case(
        "resnet",
        ((4, 320, 64, 64), (8, 1280, 16, 16), (16, 320, 64, 64)),
        ((4, 320, 64, 64),),
        ((1, 8, 4, 4),),
    ),
    "llama": Case("llama", ((2, 4096), (8, 512)), ((8, 512),), ((1, 8),)),
    "qwen2": Case("qwen2", ((2, 4096), (8, 512)), ((8, 512),), ((1, 8),)),
    "llama3": Case("llama3", ((2, 4096), (8, 512)), ((2, 4096),), ((1, 8),)),
}


def shape_label(model: str, shape: tuple[int, ...]) -> str:
    if model == "unet":
        return f"B{shape[0]} 64x64"
    if model == "vae":
        return f"B{shape[0]} {shape[1]}x{shape[2]}"
    if model in LLM_MODELS:
        return f"B{shape[0]} S{shape[1]}"
    return "(" + ", ".join(map(str, shape)) + ")"


class ResnetBlock(nn.Module):
    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, channels)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return x + h


class ResnetStack(nn.Module):
    def __init__(self, channels: int, groups: int = 32, blocks: int = 4) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[ResnetBlock(channels, groups) for _ in range(blocks)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def _diffusers():
    try:
        import diffusers
    except ImportError as e:
        raise ModelUnavailable(f"diffusers not importable ({e}); pip install '.[diffusion]'") from None
    # Its warning on casting a model with .to(dtype) (we build from a config, nothing is kept in float32).
    diffusers.utils.logging.set_verbosity_error()
    return diffusers


def _unet(tiny: bool) -> nn.Module:
    d = _diffusers()
    if not tiny:
        # The defaults are SD 1.5's UNet but for these two (1280 is SD 2's context width; no default size).
        return d.UNet2DConditionModel(sample_size=64, cross_attention_dim=768)
    return d.UNet2DConditionModel(
        sample_size=8,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
    )


def _vae(tiny: bool) -> nn.Module:
    d = _diffusers()
    if tiny:
        blocks, layers, groups = (16, 32), 1, 8
    else:
        blocks, layers, groups = (128, 256, 512, 512), 2, 32
    return d.AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * len(blocks),
        up_block_types=("UpDecoderBlock2D",) * len(blocks),
        block_out_channels=blocks,
        layers_per_block=layers,
        latent_channels=4,
        norm_num_groups=groups,
    )


def _llm(model: str, tiny: bool) -> nn.Module:
    import transformers

    if tiny:
        dims = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=128)
        kv = 1 if model == "qwen2" else 2
    else:
        dims = dict(
            hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, num_attention_heads=16, vocab_size=32000
        )
        if model == "llama3":
            dims["vocab_size"] = 128256
        kv = 4 if model == "qwen2" else 16
    common = dict(dims, num_key_value_heads=kv, max_position_embeddings=4096, tie_word_embeddings=False)
    if LLM_ARCH[model] == "llama":
        config = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    else:
        config = transformers.Qwen2Config(**common, use_sliding_window=False)
        cls = transformers.Qwen2ForCausalLM
    config._attn_implementation = "sdpa"
    return cls(config)


def build(
    model: str, shape: tuple[int, ...], device: str, dtype: torch.dtype, tiny: bool, seed: int = 0
) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The model (same weights for the same seed) and its batch, on ``device`` in ``dtype``."""
    torch.manual_seed(seed)
    if model == "unet":
        net = _unet(tiny)
    elif model == "vae":
        net = _vae(tiny)
    elif model == "resnet":
        net = ResnetStack(shape[1], groups=4 if tiny else 32, blocks=1 if tiny else 4)
    elif model in LLM_MODELS:
        net = _llm(model, tiny)
    else:
        raise ValueError(f"unknown model {model!r}; choose from {', '.join(MODELS)}")
    net = net.to(device=device, dtype=dtype).train()
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)

    def rand(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen).to(device=device, dtype=dtype)

    if model == "unet":
        cfg = net.config
        side = cfg.sample_size
        b = shape[0]
        batch = {
            "sample": rand(b, cfg.in_channels, side, side),
            "timestep": torch.randint(0, 1000, (b,), generator=gen).to(device),
            "encoder_hidden_states": rand(b, 77, cfg.cross_attention_dim),
            "target": rand(b, cfg.out_channels, side, side),
        }
    elif model == "vae":
        batch = {"sample": rand(shape[0], 3, shape[1], shape[2])}
    elif model == "resnet":
        batch = {"sample": rand(*shape)}
    else:
        ids = torch.randint(0, net.config.vocab_size, shape, generator=gen).to(device)
        batch = {"input_ids": ids}
    return net, batch


def to_layout(net: nn.Module, batch: dict[str, torch.Tensor], layout: str) -> None:
    """channels_last for the 4-D weights and inputs (in place); contiguous leaves them as built."""
    if layout == "contiguous":
        return
    if layout != "channels_last":
        raise ValueError(f"unknown layout {layout!r}; choose contiguous or channels_last")
    net.to(memory_format=torch.channels_last)
    for key, value in batch.items():
        if value.dim() == 4:
            batch[key] = value.contiguous(memory_format=torch.channels_last)


def loss_fn(model: str) -> Callable[[nn.Module, dict[str, Any]], torch.Tensor]:
    """forward + loss of one step, the callable torch.compile wraps."""
    if model == "unet":

        def unet_loss(net, batch):
            pred = net(batch["sample"], batch["timestep"], batch["encoder_hidden_states"]).sample
            return F.mse_loss(pred.float(), batch["target"].float())

        return unet_loss
    if model == "vae":

        def vae_loss(net, batch):
            latent = net.encode(batch["sample"]).latent_dist.mode()
            recon = net.decode(latent).sample
            return F.mse_loss(recon.float(), batch["sample"].float())

        return vae_loss
    if model == "resnet":

        def resnet_loss(net, batch):
            return net(batch["sample"]).float().square().mean()

        return resnet_loss

    def llm_loss(net, batch):
        return net(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss

    return llm_loss
