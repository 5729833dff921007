"""End to end: tiny randomly initialised transformers models (built from a
config, no weights downloaded) trained a few AdamW steps with and without
apply_liger_ops give the same losses, gradients and parameters, eagerly and
with the patched model under torch.compile.

Float32 and eager attention throughout.  On CPU the ops run under the Triton
interpreter; torch.compile uses the ``aot_eager`` backend there (dynamo
capture with fullgraph=True, the ops' fake kernels and AOT autograd; an
inductor compile of a model costs ~50 s on a 2-core CI runner) and
``inductor`` on CUDA.  LIGER_E2E_COMPILE_BACKEND overrides the backend.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field

import pytest
import torch

from liger_nn import apply_liger_ops
from tests.helpers import DEVICE, LigerOpCounter

transformers = pytest.importorskip("transformers")

VOCAB, BATCH, SEQ, LAYERS = 64, 2, 12, 2
STEPS = 3
LOSS_RTOL = 1e-5
# ||grad - grad_ref|| / ||grad_ref|| per parameter (and the same for the
# parameters after the steps): fp32 kernels against fp32 torch.
GRAD_RTOL = 1e-4
COMPILE_BACKEND = os.environ.get("LIGER_E2E_COMPILE_BACKEND", "inductor" if DEVICE == "cuda" else "aot_eager")

_CONFIG_KWARGS = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA: the op's Hq != Hkv path
    max_position_embeddings=64,
    initializer_range=0.2,  # larger than the default so logits (and gradients) are far from uniform
)


def tiny_model(arch: str) -> torch.nn.Module:
    config_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[arch]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config_cls(**_CONFIG_KWARGS), attn_implementation="eager")
    return model.to(DEVICE, torch.float32).train()


def token_batches(steps: int = STEPS) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen).to(DEVICE) for _ in range(steps)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@dataclass
class Trajectory:
    """What a few training steps produced: each step's loss and gradients, and the final parameters."""

    losses: list[float] = field(default_factory=list)
    grads: list[dict[str, torch.Tensor]] = field(default_factory=list)
    params: dict[str, torch.Tensor] = field(default_factory=dict)


def train(model: torch.nn.Module, step_model=None, steps: int = STEPS) -> Trajectory:
    """AdamW steps on random token ids; step_model (e.g. the compiled model) runs the forward."""
    batches = ({"input_ids": ids, "labels": ids} for ids in token_batches(steps))
    return run_steps(model, batches, torch.optim.AdamW(model.parameters(), lr=1e-2), step_model)


def run_steps(model: torch.nn.Module, batches, opt: torch.optim.Optimizer, step_model=None) -> Trajectory:
    """One optimizer step per batch (the model's keyword inputs, labels included)."""
    step_model = model if step_model is None else step_model
    out = Trajectory()
    for inputs in batches:
        loss = step_model(**inputs).loss
        loss.backward()
        out.losses.append(loss.item())
        out.grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
        opt.step()
        opt.zero_grad()
    out.params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return out


# Float64 kernels against float64 torch: a patched model's trajectory against the model as is.
FLOAT64_RTOL = 1e-10


def _rel64(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


def assert_same_float64_training(got: Trajectory, want: Trajectory) -> None:
    """Losses, gradients and final parameters within FLOAT64_RTOL, after a reference that trained."""
    assert len(set(want.losses)) == len(want.losses), f"the model did not train: {want.losses}"
    for step, (loss, ref) in enumerate(zip(got.losses, want.losses, strict=True)):
        assert math.isfinite(loss) and abs(loss - ref) <= FLOAT64_RTOL * abs(ref), f"step {step}: {loss!r} vs {ref!r}"
        assert got.grads[step].keys() == want.grads[step].keys(), f"step {step}: parameters with gradients differ"
        for name, ref_grad in want.grads[step].items():
            assert _rel64(got.grads[step][name], ref_grad) <= FLOAT64_RTOL, f"step {step}: gradient of {name}"
    for name, ref_p in want.params.items():
        assert _rel64(got.params[name], ref_p) <= FLOAT64_RTOL, f"parameter {name} after training"


def assert_same_training(got: Trajectory, want: Trajectory) -> None:
    assert len(got.losses) == len(want.losses)
    for step, (loss, ref_loss) in enumerate(zip(got.losses, want.losses, strict=True)):
        assert math.isfinite(loss) and math.isfinite(ref_loss), f"step {step}: non-finite loss {loss} / {ref_loss}"
        err = abs(loss - ref_loss) / abs(ref_loss)
        assert err <= LOSS_RTOL, f"step {step}: loss {loss!r} vs reference {ref_loss!r} (rel {err:.2e})"
        grads, ref_grads = got.grads[step], want.grads[step]
        assert grads.keys() == ref_grads.keys(), f"step {step}: parameters with gradients differ"
        for name, ref_grad in ref_grads.items():
            assert torch.isfinite(grads[name]).all(), f"step {step}: non-finite gradient in {name}"
            assert torch.isfinite(ref_grad).all(), f"step {step}: non-finite reference gradient in {name}"
            assert ref_grad.norm() > 0, f"step {step}: reference gradient of {name} is zero; nothing is checked"
            err = _rel(grads[name], ref_grad)
            assert err <= GRAD_RTOL, f"step {step}: grad of {name} differs by {err:.2e} (relative norm)"
    assert got.params.keys() == want.params.keys(), "the patched model's parameter names changed"
    for name, ref_p in want.params.items():
        assert torch.isfinite(got.params[name]).all(), f"non-finite parameter {name} after training"
        err = _rel(got.params[name], ref_p)
        assert err <= GRAD_RTOL, f"parameter {name} differs by {err:.2e} after training"


# The rotary swap is process-wide for an architecture, so each test trains the
# unpatched reference first and patches afterwards.


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_patched_training_matches_unpatched(arch):
    model = tiny_model(arch)
    with LigerOpCounter() as counter:
        want = train(copy.deepcopy(model))
    assert not counter.calls, "the reference run used the liger ops"
    with apply_liger_ops(model) as patch:
        assert patch.report.rope_modules == [f"transformers.models.{arch}.modeling_{arch}"], str(patch.report)
        with LigerOpCounter() as counter:
            got = train(model)
    # The ops are what ran: one rope and one swiglu per layer forward, two rms_norms per layer and the
    # final one, and their backward ops per backward; the fused loss once a step, with its gradients
    # in the same walk.
    norms = STEPS * (2 * LAYERS + 1)
    ops = {"rope": STEPS * LAYERS, "rope_backward": STEPS * LAYERS, "swiglu": STEPS * LAYERS,
           "swiglu_backward": STEPS * LAYERS, "rms_norm": norms, "rms_norm_backward": norms,
           "fused_linear_cross_entropy_with_grads": STEPS}  # fmt: skip
    assert counter.calls == ops, counter.calls
    assert len(set(want.losses)) == STEPS, f"the model did not train: {want.losses}"
    assert_same_training(got, want)


def test_comparison_detects_a_wrong_rotary(monkeypatch):
    """The tolerances can fail: a model whose rotary does nothing is far off the reference."""
    model = tiny_model("llama")
    want = train(copy.deepcopy(model), steps=1)
    modeling = transformers.models.llama.modeling_llama
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", lambda q, k, cos, sin, unsqueeze_dim=1: (q, k))
    with pytest.raises(AssertionError, match="loss|grad"):
        assert_same_training(train(model, steps=1), want)


def test_compiled_patched_training_matches_eager_unpatched():
    model = tiny_model("llama")
    want = train(copy.deepcopy(model), steps=2)
    seen_targets: list[str] = []

    def backend(gm, example_inputs):
        seen_targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        if COMPILE_BACKEND == "inductor":
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs)
        return torch._dynamo.lookup_backend(COMPILE_BACKEND)(gm, example_inputs)

    torch._dynamo.reset()
    try:
        with apply_liger_ops(model):
            got = train(model, step_model=torch.compile(model, backend=backend, fullgraph=True), steps=2)
    finally:
        torch._dynamo.reset()
    rope_nodes = [t for t in seen_targets if t in ("liger.rope", "liger.rope.default")]
    assert len(rope_nodes) == LAYERS, sorted(set(seen_targets))
    assert_same_training(got, want)
