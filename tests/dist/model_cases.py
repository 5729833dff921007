"""Training with the ops inside parallel stacks, against the same model
trained in one process:

* a tiny Llama (transformers' LlamaForCausalLM from a config) patched by
  ``apply_liger_ops`` and tensor-parallel (``torch.distributed.tensor.parallel``:
  Colwise/Rowwise on attention and MLP, SequenceParallel on the norms);
  a second plan keeps q/k/v as DTensors (heads sharded), so the rope op
  itself runs on DTensors through its sharding rule;
* a model of ``liger_nn.PolyNorm`` and ``liger_nn.GroupNorm`` layers under
  FSDP2 (``fully_shard``), each rank on its slice of the batch.

Three AdamW steps; each step's loss and every gradient, and the parameters
after the steps, match the single-process run.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard

import registrations  # noqa: F401
from tests.dist.harness import Case, Context
from tests.helpers import LigerOpCounter

STEPS = 3
LOSS_RTOL = 1e-5
# Parameter gradients and parameters after the steps: ||a - b|| / ||b||.
GRAD_RTOL = 1e-4
VOCAB, BATCH, SEQ, LAYERS = 64, 2, 8, 2


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a = (a.full_tensor() if isinstance(a, DTensor) else a).detach().double().cpu()
    b = (b.full_tensor() if isinstance(b, DTensor) else b).detach().double().cpu()
    assert torch.isfinite(a).all() and torch.isfinite(b).all(), "non-finite values"
    assert b.norm() > 0, "reference is zero; nothing is checked"
    return ((a - b).norm() / b.norm()).item()


def _train(model: nn.Module, batches, loss_fn, steps: int = STEPS, context=contextlib.nullcontext):
    """(losses, per-step {name: grad}, final {name: param}); grads and params may be DTensors."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    losses, grads = [], []
    for step in range(steps):
        with context():
            loss = loss_fn(model, batches[step])
            loss.backward()
        losses.append(loss.detach().item())
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    return losses, grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def _assert_same_training(got, want) -> None:
    (losses, grads, params), (ref_losses, ref_grads, ref_params) = got, want
    assert len(set(ref_losses)) == len(ref_losses), f"the model did not train: {ref_losses}"
    for step, (loss, ref) in enumerate(zip(losses, ref_losses, strict=True)):
        assert math.isfinite(loss), f"step {step}: loss {loss}"
        assert abs(loss - ref) <= LOSS_RTOL * abs(ref), f"step {step}: loss {loss!r} vs single process {ref!r}"
        assert grads[step].keys() == ref_grads[step].keys()
        for name, ref_grad in ref_grads[step].items():
            err = _rel(grads[step][name], ref_grad)
            assert err <= GRAD_RTOL, f"step {step}: grad of {name} differs by {err:.2e}"
    for name, ref in ref_params.items():
        err = _rel(params[name], ref)
        assert err <= GRAD_RTOL, f"parameter {name} differs by {err:.2e} after training"


# ---------------------------------------------------------------------------
# Tensor-parallel tiny Llama


def tiny_llama(device: torch.device) -> nn.Module:
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA; both head counts divisible by 2 ranks
        max_position_embeddings=64,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.config._attn_implementation = "eager"
    return model.to(device, torch.float32).train()


def tp_plan(model: nn.Module, dtensor_heads: bool) -> dict:
    """torchtitan's Llama plan for HF module names.  dtensor_heads: q/k/v stay
    DTensors (sharded on heads after the view), so rope and attention run on
    DTensors; otherwise they are local tensors holding this rank's heads."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan = {
        # The residual stream stays a DTensor (sharded on the sequence): HF builds
        # position ids and the causal mask from its (global) shape.
        "model.embed_tokens": RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
        ),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    for i in range(len(model.model.layers)):
        layer = f"model.layers.{i}"
        plan |= {
            f"{layer}.input_layernorm": SequenceParallel(),
            f"{layer}.self_attn": PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
            ),
            f"{layer}.self_attn.q_proj": ColwiseParallel(use_local_output=not dtensor_heads),
            f"{layer}.self_attn.k_proj": ColwiseParallel(use_local_output=not dtensor_heads),
            f"{layer}.self_attn.v_proj": ColwiseParallel(use_local_output=not dtensor_heads),
            f"{layer}.self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            f"{layer}.post_attention_layernorm": SequenceParallel(),
            f"{layer}.mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            f"{layer}.mlp.gate_proj": ColwiseParallel(),
            f"{layer}.mlp.up_proj": ColwiseParallel(),
            f"{layer}.mlp.down_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        }
    return plan


def _token_batches(device: torch.device) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen).to(device) for _ in range(STEPS)]


def _lm_loss(model, ids):
    return model(input_ids=ids, labels=ids, use_cache=False).loss


def tp_llama(ctx: Context, dtensor_heads: bool = False, compiled: bool = False) -> None:
    """compiled: the TP model under torch.compile(fullgraph=True: no graph breaks), with
    mode="reduce-overhead" (CUDA graphs) on GPUs and the aot_eager backend on CPU."""
    from torch.distributed.tensor.experimental import implicit_replication
    from torch.distributed.tensor.parallel import parallelize_module

    from liger_nn import apply_liger_ops

    model = tiny_llama(ctx.device)
    batches = _token_batches(ctx.device)
    with apply_liger_ops(model) as patch:
        assert patch.report.rope_modules == ["transformers.models.llama.modeling_llama"], str(patch.report)
        want = _train(copy.deepcopy(model), batches, _lm_loss)
        tp = parallelize_module(copy.deepcopy(model), ctx.mesh(), tp_plan(model, dtensor_heads))
        # With DTensor heads, HF's plain cos/sin and mask meet DTensors (in the
        # forward and in rope's backward): treated as replicated.
        context = implicit_replication if dtensor_heads else contextlib.nullcontext
        if compiled:
            torch._dynamo.reset()
            options = {"mode": "reduce-overhead"} if ctx.device.type == "cuda" else {"backend": "aot_eager"}
            step_model = torch.compile(tp, fullgraph=True, **options)
            try:
                got = _train(tp, batches, lambda _, ids: _lm_loss(step_model, ids), context=context)
            finally:
                torch._dynamo.reset()
            _assert_same_training(got, want)
            return
        with LigerOpCounter() as counter:
            got = _train(tp, batches, _lm_loss, context=context)
    assert counter.calls["rope"] == STEPS * LAYERS and counter.calls["rope_backward"] == STEPS * LAYERS, counter.calls
    _assert_same_training(got, want)


# ---------------------------------------------------------------------------
# FSDP2 over PolyNorm and GroupNorm layers


class NormBlock(nn.Module):
    """Linear -> liger GroupNorm over the features -> liger PolyNorm -> Linear, with a residual."""

    def __init__(self, width: int, groups: int) -> None:
        super().__init__()
        from liger_nn import GroupNorm, PolyNorm

        self.up = nn.Linear(width, 2 * width)
        self.poly = PolyNorm()
        self.group = GroupNorm(groups, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, width)
        h = self.group(self.up(x).transpose(1, 2)).transpose(1, 2)
        return x + self.down(self.poly(h))


def norm_model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(NormBlock(16, 4), NormBlock(16, 8), nn.Linear(16, 4))
    with torch.no_grad():  # parameters away from their identity initialisation, so each gradient is distinct
        for block in model[:2]:
            block.poly.weight.copy_(torch.tensor([0.5, -0.3, 0.8]))
            block.poly.bias.fill_(0.1)
            block.group.weight.normal_(1.0, 0.2)
            block.group.bias.normal_(0.0, 0.2)
    return model.to(device)


def fsdp2(ctx: Context) -> None:
    from torch.distributed.fsdp import fully_shard

    model = norm_model(ctx.device)
    gen = torch.Generator().manual_seed(2)
    global_batch = 2 * ctx.world_size
    data = [(torch.randn(global_batch, 6, 16, generator=gen), torch.randn(global_batch, 6, 4, generator=gen))
            for _ in range(STEPS)]  # fmt: skip
    data = [(x.to(ctx.device), y.to(ctx.device)) for x, y in data]
    mine = slice(2 * ctx.rank, 2 * ctx.rank + 2)

    def mse(m, batch):
        x, y = batch
        return nn.functional.mse_loss(m(x), y)

    want = _train(copy.deepcopy(model), data, mse)
    sharded = copy.deepcopy(model)
    for block in sharded[:2]:
        fully_shard(block, mesh=ctx.mesh())
    fully_shard(sharded, mesh=ctx.mesh())
    with LigerOpCounter() as counter:
        losses, grads, params = _train(sharded, [(x[mine], y[mine]) for x, y in data], mse)
    assert counter.calls["poly_norm"] == 2 * STEPS and counter.calls["group_norm_backward"] == 2 * STEPS, counter.calls
    # Each rank's loss is the mean over its slice; the global loss is their mean.
    mean_losses = []
    for loss in losses:
        t = torch.tensor([loss], device=ctx.device, dtype=torch.float64)
        torch.distributed.all_reduce(t)
        mean_losses.append(t.item() / ctx.world_size)
    _assert_same_training((mean_losses, grads, params), want)


def cases(world_size: int) -> list[tuple[str, Case]]:
    return [
        ("tp_llama/local_heads", tp_llama),
        ("tp_llama/dtensor_heads", lambda ctx: tp_llama(ctx, dtensor_heads=True)),
        ("fsdp2/poly_norm_group_norm", fsdp2),
    ]


def compiled_cases(world_size: int) -> list[tuple[str, Case]]:
    """Slower (a compile per rank): run by nox -s multigpu, not by the CPU suite."""
    return [("tp_llama/compiled", lambda ctx: tp_llama(ctx, compiled=True))]
