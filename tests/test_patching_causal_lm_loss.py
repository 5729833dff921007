"""apply_liger_ops' causal-LM loss routing (liger_nn/patching/swap_causal_lm_loss.py,
liger_nn/lm_head_loss.py): tiny float64 models train with the same losses, gradients
and parameters as the model as is (Llama; Gemma 2's soft-capping; Cohere's logit
scale; Phi's LM-head bias), gradient accumulation's num_items_in_batch included;
training steps with labels return no logits, every other call runs the original
forward; remove() restores it; models the routing cannot take are reported."""

from __future__ import annotations

import copy
import inspect
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from liger_nn import apply_liger_ops
from liger_nn.lm_head_loss import causal_lm_loss
from tests.helpers import DEVICE, LigerOpCounter
from tests.test_e2e_training import (
    _CONFIG_KWARGS,
    FLOAT64_RTOL,
    STEPS,
    assert_same_float64_training,
    token_batches,
    train,
)

transformers = pytest.importorskip("transformers")

KIND = "fused_linear_cross_entropy"
TRAINING = KIND + "_with_grads"  # a training step's loss: its gradients in the forward's walk
# config class -> what its forward does to the head's output (the routing must do the same)
ARCHS = {
    "LlamaConfig": {},
    "Gemma2Config": {"final_logit_softcapping": 3.0},
    "CohereConfig": {"logit_scale": 0.5},
    "PhiConfig": {},  # an LM head with a bias
}
ONLY_THE_LOSS = dict(rope=False, glu=False, rms_norm=False, layer_norm=False)


def float64_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None, **kw):
    """transformers' ForCausalLMLoss without its upcast to float32 (the model as is, in float64)."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    reduction = "mean" if num_items_in_batch is None else "sum"
    loss = F.cross_entropy(logits.reshape(-1, vocab_size), shift_labels.reshape(-1), ignore_index=ignore_index,
                           reduction=reduction)  # fmt: skip
    return loss if num_items_in_batch is None else loss / num_items_in_batch


def tiny_float64(config_name: str) -> nn.Module:
    config = getattr(transformers, config_name)(**_CONFIG_KWARGS, **ARCHS.get(config_name, {}))
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # configs' token ids outside the tiny vocabulary
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return model.to(DEVICE, torch.float64).train()


def as_is_in_float64(model: nn.Module) -> nn.Module:
    ref = copy.deepcopy(model)
    ref.loss_function = float64_loss
    return ref


@pytest.mark.parametrize("config_name", sorted(ARCHS))
def test_routed_loss_trains_like_the_model_as_is_in_float64(config_name):
    model = tiny_float64(config_name)
    want = train(as_is_in_float64(model))
    with apply_liger_ops(model, **ONLY_THE_LOSS) as patch:
        assert [(r.kind, r.target) for r in patch.report.replaced] == [(KIND, "")], str(patch.report)
        with LigerOpCounter() as counter:
            got = train(model)
    assert counter.calls == {TRAINING: STEPS}, counter.calls
    assert "forward" not in vars(model)  # removed
    assert_same_float64_training(got, want)


def test_a_copy_of_the_patched_model_trains_its_own_parameters():
    """The routed forward is a method bound to its model: a deepcopy (an EMA copy, a trainer's
    reference model) runs its own base model and head, not the original's."""
    model = tiny_float64("LlamaConfig")
    want = train(as_is_in_float64(model))
    with apply_liger_ops(model, **ONLY_THE_LOSS):
        copied = copy.deepcopy(model)
    assert vars(copied)["forward"].__self__ is copied
    with LigerOpCounter() as counter:
        got = train(copied)
    assert counter.calls[TRAINING] == STEPS
    assert_same_float64_training(got, want)


def test_a_tensor_parallel_head_keeps_the_models_own_forward(monkeypatch):
    """A DTensor head (tests/dist/model_cases.py trains one under tensor parallelism) takes the
    class's forward: the op would gather a vocabulary-sharded head."""
    import liger_nn.lm_head_loss as routed

    model = tiny_float64("LlamaConfig")
    ids = token_batches(1)[0]
    with apply_liger_ops(model, **ONLY_THE_LOSS):
        assert model(input_ids=ids, labels=ids).logits is None
        monkeypatch.setattr(routed, "_is_dtensor", lambda t: t is model.lm_head.weight)
        with LigerOpCounter() as counter:
            out = model(input_ids=ids, labels=ids)
        assert out.logits is not None and KIND not in counter.calls and TRAINING not in counter.calls


def test_gradient_accumulation_divides_the_sum_by_num_items_in_batch():
    model = tiny_float64("LlamaConfig")
    ref = as_is_in_float64(model)
    ids = token_batches(1)[0]
    labels = ids.clone()
    labels[:, :4] = -100
    for num_items in (torch.tensor(13, device=DEVICE), 13):
        want = ref(input_ids=ids, labels=labels, num_items_in_batch=num_items).loss
        with apply_liger_ops(model, **ONLY_THE_LOSS):
            got = model(input_ids=ids, labels=labels, num_items_in_batch=num_items).loss
        assert abs(got.item() - want.item()) <= FLOAT64_RTOL * abs(want.item())
    shifted = F.pad(labels, (0, 1), value=-100)[..., 1:]
    with apply_liger_ops(model, **ONLY_THE_LOSS):
        by_shift_labels = model(input_ids=ids, labels=labels, shift_labels=shifted).loss
    assert abs(by_shift_labels.item() - ref(input_ids=ids, labels=labels).loss.item()) <= FLOAT64_RTOL


def test_logits_are_skipped_only_in_training_steps_with_labels():
    model = tiny_float64("LlamaConfig")
    ids = token_batches(1)[0]
    with apply_liger_ops(model, **ONLY_THE_LOSS):
        # The Trainer reads the forward's parameters to keep the dataset's columns.
        assert "labels" in inspect.signature(model.forward).parameters
        trained = model(input_ids=ids, labels=ids)
        assert trained.logits is None and trained.loss is not None
        positional = model(ids, None, None, None, None, ids)  # input_ids, ..., labels by position
        assert positional.logits is None and positional.loss.item() == trained.loss.item()
        assert model(input_ids=ids).logits.shape == (*ids.shape, _CONFIG_KWARGS["vocab_size"])
        kept = model(input_ids=ids, labels=ids, skip_logits=False)
        assert kept.logits is not None and abs(kept.loss.item() - trained.loss.item()) <= 1e-6
        model.eval()
        evaluated = model(input_ids=ids, labels=ids)
        assert evaluated.logits is not None
        assert model(input_ids=ids, labels=ids, skip_logits=True).logits is None
        assert isinstance(model(input_ids=ids, labels=ids, skip_logits=True, return_dict=False), tuple)
        with pytest.raises(ValueError, match="needs labels"):
            model(input_ids=ids, skip_logits=True)


def test_models_the_routing_cannot_take_are_reported_and_left_alone():
    custom = tiny_float64("LlamaConfig")
    custom.loss_function = float64_loss
    with apply_liger_ops(custom, **ONLY_THE_LOSS) as patch:
        left = {r.target: r.detail for r in patch.report.left_alone if r.kind == KIND}
        assert "is not transformers' ForCausalLMLoss" in left[""]
        assert "forward" not in vars(custom)
    config = transformers.MixtralConfig(**_CONFIG_KWARGS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        moe = transformers.AutoModelForCausalLM.from_config(config)
    with apply_liger_ops(moe, **ONLY_THE_LOSS) as patch:
        left = {r.target: r.detail for r in patch.report.left_alone if r.kind == KIND}
        assert "'mixtral' is not in the fused loss's table" in left[""]
    with apply_liger_ops(tiny_float64("LlamaConfig"), **ONLY_THE_LOSS, fused_linear_cross_entropy=False) as patch:
        assert not patch.report.replaced


def test_causal_lm_loss_matches_cross_entropy_on_the_logits():
    torch.manual_seed(0)
    head = nn.Linear(16, 40, bias=True, device=DEVICE, dtype=torch.float64)
    hidden = torch.randn(2, 7, 16, device=DEVICE, dtype=torch.float64)
    labels = torch.randint(0, 40, (2, 7), device=DEVICE)
    labels[1, 2:] = -100
    logits = head(hidden * 0.5)
    want = float64_loss(torch.tanh(logits / 4.0) * 4.0, labels, 40)
    got = causal_lm_loss(hidden, head, labels, softcap=4.0, logit_scale=0.5)
    assert abs(got.item() - want.item()) <= FLOAT64_RTOL * abs(want.item())
    with pytest.raises(ValueError, match="labels or shift_labels"):
        causal_lm_loss(hidden, head)
