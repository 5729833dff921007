"""Small host-bound training steps under torch.compile, for
``python -m bench.host_overhead --steps``: how much a compiled graph holding
liger ops costs per step against the same model with torch's own layers.

Two models, each in three providers:

    gn_silu   8 layers of GroupNorm -> SiLU on a tiny bf16 (2, 8, 16) input
              (issue 26's probe)
    rope      a small attention block: q/k/v projections, rotary embedding
              of q and k, SDPA, output projection; bf16, (B1, S16, 4 heads,
              2 kv heads, head_dim 64)

    native      torch's layers (nn.GroupNorm; HF's rotate_half rope in torch ops)
    opaque      liger ops, kept as one opaque node each in the compiled graph
                (registrations._library.decomposition(False) while tracing)
    decomposed  liger ops decomposed into their kernels (the default)

A step is the compiled forward (``mode``: default or reduce-overhead) and
torch.autograd.grad of the output against a fixed gradient with respect to
the input and the parameters (AOTAutograd's compiled backward).  Each
(model, provider, mode) gets its own code object, so Dynamo's caches never
mix providers; tracing (the first calls, in ``Step.prepare``) happens under
the provider's decomposition setting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MODELS = ("gn_silu", "rope")
PROVIDERS = ("native", "opaque", "decomposed")
MODES = ("default", "reduce-overhead")
LAYERS = 8


def _group_norm_model(provider: str, device: str, dtype: Any) -> Any:
    import torch
    from torch import nn

    import liger_nn

    norm = nn.GroupNorm if provider == "native" else liger_nn.GroupNorm
    layers = []
    for _ in range(LAYERS):
        layers += [norm(4, 8), nn.SiLU()]
    # Parameters in x's dtype: torch's CUDA GroupNorm refuses bf16 x with float32 weights
    # ("expected scalar type BFloat16 but found Float", torch 2.11 on the H200).
    model = nn.Sequential(*layers).to(device=device, dtype=dtype)
    x = torch.randn(2, 8, 16, device=device, dtype=dtype, requires_grad=True)
    return model, (x,)


def _rotate_half(x: Any) -> Any:
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Attention:
    """Built lazily (torch imported late): an nn.Module with a rope of choice."""

    @staticmethod
    def make(provider: str, device: str, dtype: Any) -> Any:
        import torch
        from torch import nn

        import liger_nn

        hidden, heads, kv_heads, head_dim, seq = 256, 4, 2, 64, 16

        class Attention(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.q = nn.Linear(hidden, heads * head_dim, bias=False)
                self.k = nn.Linear(hidden, kv_heads * head_dim, bias=False)
                self.v = nn.Linear(hidden, kv_heads * head_dim, bias=False)
                self.o = nn.Linear(heads * head_dim, hidden, bias=False)
                inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
                angles = torch.outer(torch.arange(seq).float(), inv)
                emb = torch.cat((angles, angles), dim=-1)
                self.register_buffer("cos", emb.cos())
                self.register_buffer("sin", emb.sin())

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                b, s, _ = x.shape
                q = self.q(x).view(b, s, heads, head_dim).transpose(1, 2)
                k = self.k(x).view(b, s, kv_heads, head_dim).transpose(1, 2)
                v = self.v(x).view(b, s, kv_heads, head_dim).transpose(1, 2)
                cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
                if provider == "native":
                    q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
                else:
                    q, k = liger_nn.apply_rotary_pos_emb(q, k, cos, sin)
                out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                return self.o(out.transpose(1, 2).reshape(b, s, heads * head_dim))

        model = Attention().to(device=device, dtype=dtype)
        x = torch.randn(1, seq, hidden, device=device, dtype=dtype, requires_grad=True)
        return model, (x,)


_BUILDERS: dict[str, Callable[[str, str, Any], Any]] = {"gn_silu": _group_norm_model, "rope": _Attention.make}

_FORWARD_SOURCE = """
def forward(model, *inputs):
    return model(*inputs)
"""


def _own_code(tag: str) -> Callable:
    """A fresh ``forward(model, *inputs)`` with a code object of its own (Dynamo caches per code object)."""
    namespace: dict[str, Any] = {}
    exec(compile(_FORWARD_SOURCE, f"<bench.compiled_steps {tag}>", "exec"), namespace)
    return namespace["forward"]


@dataclass
class Step:
    model: str
    provider: str
    mode: str
    run: Callable[[], Any]
    decompose: bool

    def prepare(self, calls: int = 3) -> None:
        """Trace and compile (forward and backward) under the provider's setting."""
        from registrations import _library

        with _library.decomposition(self.decompose):
            for _ in range(calls):
                self.run()


def build(model: str, provider: str, mode: str, device: str, dtype_name: str = "bfloat16") -> Step:
    import torch

    dtype = getattr(torch, dtype_name)
    net, inputs = _BUILDERS[model](provider, device, dtype)
    params = tuple(p for p in net.parameters() if p.requires_grad)
    with torch.no_grad():
        grad_out = torch.randn_like(net(*inputs))
    compiled = torch.compile(_own_code(f"{model} {provider} {mode}"), mode=None if mode == "default" else mode)
    wrt = (*inputs, *params)
    new_step = torch.compiler.cudagraph_mark_step_begin if mode == "reduce-overhead" else (lambda: None)

    def run() -> Any:
        new_step()
        return torch.autograd.grad(compiled(net, *inputs), wrt, grad_out)

    return Step(model, provider, mode, run, decompose=provider != "opaque")


def steps(device: str, models=MODELS, providers=PROVIDERS, modes=MODES) -> dict[str, Step]:
    """Every (model, provider, mode), prepared, by "model provider mode"."""
    built = {}
    for model in models:
        for provider in providers:
            for mode in modes:
                s = build(model, provider, mode, device)
                s.prepare()
                built[f"{model} {provider} {mode}"] = s
    return built
