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
from liger_nn.patching import hub_function, rope_patched_modules
from tests.helpers import DEVICE, LigerOpCounter, TorchPolyNorm


class CenteredPolyNorm(TorchPolyNorm):
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
        self.act = TorchPolyNorm()
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
        assert type(net.act) is TorchPolyNorm
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
    assert inspect.signature(patched) == inspect.signature(hub_function(original) or original)
    with apply_liger_ops(_llama(hf)) as second:
        assert modeling.apply_rotary_pos_emb is patched
        assert rope_patched_modules() == {modeling.__name__: 2}
        assert second.report.rope_modules == [modeling.__name__]
        assert second.report.rope_functions == [f"{modeling.__name__}.apply_rotary_pos_emb"]
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
        # bf16 q/k with float32 tables (autocast): float32 math, q's dtype out.
        q16, k16 = q.bfloat16(), k.bfloat16()
        q_out, _ = patched(q16, k16, cos, sin)
        assert q_out.dtype == torch.bfloat16
        assert _rel(q_out.float(), original(q16.float(), k16.float(), cos, sin)[0]) <= 1e-2


def test_rope_left_alone_outside_allow_list_or_when_check_fails(hf, monkeypatch):
    modeling = hf.models.llama.modeling_llama
    model = _llama(hf)
    with apply_liger_ops(
        model, rope_architectures=(), glu=False, rms_norm=False, fused_linear_cross_entropy=False
    ) as patch:
        assert patch.report.replaced == []
        assert [r.target for r in patch.report.left_alone] == [f"{modeling.__name__}.apply_rotary_pos_emb"]
        assert "allow-list" in patch.report.left_alone[0].detail
    with apply_liger_ops(model, rope=False, glu=False, rms_norm=False, fused_linear_cross_entropy=False) as patch:
        assert patch.report.replaced == [] and patch.report.left_alone == []

    def cos_only(q, k, cos, sin, unsqueeze_dim=1):  # right signature, other formula
        return q * cos.unsqueeze(unsqueeze_dim), k * cos.unsqueeze(unsqueeze_dim)

    def other_signature(q, k, cos, sin, rotary_dim):
        return q, k

    for fake, reason in ((cos_only, "differs"), (other_signature, "signature")):
        monkeypatch.setattr(modeling, "apply_rotary_pos_emb", fake)
        with pytest.warns(liger_nn.LigerPatchWarning, match=f"'llama'.*{reason}"):
            patch = apply_liger_ops(model)
        with patch:
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


# --- every architecture of ROPE_FUNCTIONS beyond Llama's ---------------------
#
# Tiny randomly initialised models (one decoder layer, hidden 32, float32,
# eager attention; the VL models get one vision block and an image):
# the patched model's logits match the unpatched model's, and the liger ops
# are what ran.  References are computed before patching: the swap is
# process-wide for an architecture.

VOCAB = 64
IMAGE, VISION_START, VISION_END = 60, 62, 63  # token ids of the VL models' tiny vocabulary
LOGITS_RTOL = 1e-5  # fp32 kernel against fp32 torch
_TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,  # GQA
    max_position_embeddings=64,
    initializer_range=0.2,  # far from uniform logits
)
_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=16)
_DEEPSEEK = dict(
    _TEXT, num_key_value_heads=2, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
    v_head_dim=8, n_routed_experts=4, n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1, **_MOE,
)  # fmt: skip
_VL_TEXT = dict(_TEXT, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]})
_VL_TOKENS = dict(image_token_id=IMAGE, video_token_id=61, vision_start_token_id=VISION_START,
                  vision_end_token_id=VISION_END)  # fmt: skip
_VISION = dict(depth=1, num_heads=2, patch_size=2, spatial_merge_size=2, temporal_patch_size=2, initializer_range=0.2)

# arch -> (config class name, its kwargs, whether the model takes an image)
TINY: dict[str, tuple[str, dict, bool]] = {
    # Llama's rotary under other attention classes (Llama and Qwen2 train in test_e2e_training.py).
    "mistral": ("MistralConfig", _TEXT, False),
    "gemma2": ("Gemma2Config", dict(_TEXT, head_dim=16, pad_token_id=0), False),
    "olmo2": ("Olmo2Config", _TEXT, False),
    "phi": ("PhiConfig", dict(_TEXT, partial_rotary_factor=0.5), False),
    "stablelm": ("StableLmConfig", dict(_TEXT, partial_rotary_factor=0.25), False),
    "phi3": ("Phi3Config", dict(_TEXT, partial_rotary_factor=0.5, pad_token_id=0), False),
    "gpt_neox": ("GPTNeoXConfig", dict(_TEXT, num_key_value_heads=None, rotary_pct=0.25), False),
    "qwen3_next": (
        "Qwen3NextConfig",
        dict(
            _TEXT,
            head_dim=16,
            layer_types=["full_attention"],
            num_experts=4,
            shared_expert_intermediate_size=16,
            **_MOE,
        ),  # fmt: skip
        False,
    ),
    "cohere": ("CohereConfig", dict(_TEXT, pad_token_id=0), False),
    "glm4": ("Glm4Config", dict(_TEXT, pad_token_id=0), False),  # partial_rotary_factor 0.5 by default
    "deepseek_v3": ("DeepseekV3Config", _DEEPSEEK, False),  # rope_interleave=True by default
    "deepseek_v3-halves": ("DeepseekV3Config", dict(_DEEPSEEK, rope_interleave=False), False),
    "qwen2_vl": (
        "Qwen2VLConfig",
        dict(
            text_config=_VL_TEXT, vision_config=dict(_VISION, embed_dim=16, hidden_size=32, mlp_ratio=2), **_VL_TOKENS
        ),  # fmt: skip
        True,
    ),
    "qwen2_5_vl": (
        "Qwen2_5_VLConfig",
        dict(
            text_config=_VL_TEXT,
            vision_config=dict(
                _VISION,
                hidden_size=16,
                intermediate_size=32,
                out_hidden_size=32,
                window_size=8,
                fullatt_block_indexes=[0],
            ),
            **_VL_TOKENS,
        ),  # fmt: skip
        True,
    ),
}


def tiny_arch_model(transformers, name: str) -> nn.Module:
    config_cls, kwargs, multimodal = TINY[name]
    config = getattr(transformers, config_cls)(**copy.deepcopy(kwargs))
    auto = transformers.AutoModelForImageTextToText if multimodal else transformers.AutoModelForCausalLM
    torch.manual_seed(0)
    return auto.from_config(config, attn_implementation="eager").to(DEVICE, torch.float32)


def tiny_batch(name: str, seed: int, batch: int) -> dict[str, torch.Tensor]:
    """Random tokens (6 per sample: the interpreter's cost grows with the
    rows); for the VL models one 2x4-patch image per sample, whose two merged
    tokens get M-RoPE positions that differ between the streams."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, IMAGE, (batch, 6), generator=gen)
    inputs = {"input_ids": ids, "use_cache": False}
    if TINY[name][2]:
        ids[:, 1], ids[:, 2:4], ids[:, 4] = VISION_START, IMAGE, VISION_END
        patch_dim = 3 * 2 * 2 * 2  # channels * temporal_patch_size * patch_size**2
        inputs.update(
            pixel_values=torch.randn(batch * 8, patch_dim, generator=gen),
            image_grid_thw=torch.tensor([[1, 2, 4]] * batch),
            mm_token_type_ids=(ids == IMAGE).int(),
        )
    return {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _transformers_major() -> int:
    from importlib.metadata import version

    return int(version("transformers").split(".")[0])


# The tiny configs of these are written in transformers 5's schema (rope_parameters, the VL
# text/vision split) and their rotary functions in 4.x are other functions (apply_multimodal_rotary_pos_emb).
NEEDS_TRANSFORMERS_5 = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"}
# transformers 4.x's function of another convention than 5.x's: the patch-time check refuses it.
DIFFERS_IN_TRANSFORMERS_4 = {"deepseek_v3": ("apply_rotary_pos_emb_interleave",)}


def skip_unless_transformers_5(arch: str) -> None:
    if arch in NEEDS_TRANSFORMERS_5 and _transformers_major() < 5:
        pytest.skip(f"{arch}'s tiny model and rotary are transformers 5's (tested on 5.17 and 5.25)")


def expected_rope_functions(arch: str) -> list[str]:
    from liger_nn.patching import ROPE_FUNCTIONS

    module = f"transformers.models.{arch}.modeling_{arch}"
    differs = DIFFERS_IN_TRANSFORMERS_4.get(arch, ()) if _transformers_major() < 5 else ()
    return [f"{module}.{function}" for function, _ in ROPE_FUNCTIONS[arch] if function not in differs]


# The tiny models whose attention calls such a function (config.rope_interleave): no op call on 4.x.
CALLS_WHAT_DIFFERS_IN_TRANSFORMERS_4 = {"deepseek_v3"}


def refused_rope_functions(arch: str) -> list[str]:
    """What the numeric check must leave alone: DIFFERS_IN_TRANSFORMERS_4's functions, on 4.x."""
    if _transformers_major() >= 5:
        return []
    module = f"transformers.models.{arch}.modeling_{arch}"
    return [f"{module}.{function}" for function in DIFFERS_IN_TRANSFORMERS_4.get(arch, ())]


def assert_rope_refusals(arch: str, report) -> None:
    refused = [r for r in report.left_alone if r.kind == "rope"]
    assert [r.target for r in refused] == refused_rope_functions(arch), str(report)
    assert all("differs" in r.detail for r in refused), str(report)


def refusal_warnings(arch: str):
    """The LigerPatchWarning naming the architecture where refused_rope_functions is not empty; else nothing."""
    import contextlib

    if not refused_rope_functions(arch):
        return contextlib.nullcontext()
    return pytest.warns(liger_nn.LigerPatchWarning, match=f"'{arch}'.*differs")


def module_calls(report, steps: int, backward: bool = True) -> dict[str, int]:
    """The op calls ``steps`` forwards (and backwards) of the patched model make through its module
    swaps: one per module swapped, each run once a forward (the gated MLPs' swiglu / geglu,
    tests/test_patching_glu.py; rms_norm and layer_norm, tests/test_patching_norms.py), and the
    routed loss once a training step, its gradients in the same walk
    (tests/test_patching_causal_lm_loss.py)."""
    calls: dict[str, int] = {}
    for r in report.replaced:
        if r.kind == "glu":
            op = "swiglu" if r.detail.endswith("SwiGLUMLP") else "geglu"
        elif r.kind in ("rms_norm", "layer_norm"):
            op = r.kind
        elif r.kind == "fused_linear_cross_entropy" and backward:  # training steps with labels only
            calls[f"{r.kind}_with_grads"] = calls.get(f"{r.kind}_with_grads", 0) + steps
            continue
        else:
            continue
        for name in (op, f"{op}_backward") if backward else (op,):
            calls[name] = calls.get(name, 0) + steps
    return calls


def runs_what_transformers_4_refuses(name: str) -> bool:
    return name in CALLS_WHAT_DIFFERS_IN_TRANSFORMERS_4 and _transformers_major() < 5


@pytest.mark.parametrize("name", list(TINY))
def test_rope_of_each_architecture_runs_the_op(hf, name):
    arch = name.split("-")[0]
    skip_unless_transformers_5(arch)
    model = tiny_arch_model(hf, name).eval()
    inputs = tiny_batch(name, seed=1, batch=1 if TINY[name][2] else 2)
    with torch.no_grad(), LigerOpCounter() as counter:
        want = model(**inputs).logits
    assert not counter.calls, "the reference run used the liger ops"
    with refusal_warnings(arch):
        patch = apply_liger_ops(model)
    with patch:
        assert patch.report.rope_functions == expected_rope_functions(arch), str(patch.report)
        assert_rope_refusals(arch, patch.report)
        with torch.no_grad(), LigerOpCounter() as counter:
            got = model(**inputs).logits
    # One rope per attention layer: the text layer, and the vision block of the VL models.
    want_calls = {} if runs_what_transformers_4_refuses(name) else {"rope": 2 if TINY[name][2] else 1}
    want_calls.update(module_calls(patch.report, 1, backward=False))
    assert counter.calls == want_calls, counter.calls
    assert _rel(got, want) <= LOGITS_RTOL


@pytest.mark.parametrize(
    ("arch", "foreign_arch", "reason"),
    [
        ("cohere", "glm4", "differs"),  # GPT-J pairs on the wrong tables
        ("glm4", "cohere", "differs"),
        ("deepseek_v3", "llama", "differs"),  # rotate_half where DeepSeek de-interleaves
        ("phi3", "llama", "raised"),  # no partial rotary
    ],
)
def test_rope_check_refuses_another_convention(hf, monkeypatch, arch, foreign_arch, reason):
    """Each convention's patch-time check tells it from its neighbour: the
    architecture's function replaced by another architecture's is left alone."""
    import importlib

    from liger_nn.patching import ROPE_FUNCTIONS

    modeling = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
    foreign = importlib.import_module(f"transformers.models.{foreign_arch}.modeling_{foreign_arch}")
    function = ROPE_FUNCTIONS[arch][-1][0]
    monkeypatch.setattr(modeling, function, foreign.apply_rotary_pos_emb)
    model = tiny_arch_model(hf, arch)
    with pytest.warns(liger_nn.LigerPatchWarning, match=f"'{arch}'.*{reason}"):
        patch = apply_liger_ops(model)
    with patch:
        left = {r.target: r.detail for r in patch.report.left_alone if r.kind == "rope"}
        assert reason in left[f"{modeling.__name__}.{function}"], str(patch.report)
        assert getattr(modeling, function) is foreign.apply_rotary_pos_emb


def test_rope_unknown_function_of_an_allowed_module_is_reported(hf, monkeypatch):
    modeling = hf.models.llama.modeling_llama
    extra = modeling.apply_rotary_pos_emb
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb_extra", extra, raising=False)
    with pytest.warns(liger_nn.LigerPatchWarning, match="'llama'.*apply_rotary_pos_emb_extra: no liger convention"):
        patch = apply_liger_ops(_llama(hf))
    with patch:
        assert patch.report.rope_functions == [f"{modeling.__name__}.apply_rotary_pos_emb"]
        left = {r.target: r.detail for r in patch.report.left_alone}
        assert "no liger convention" in left[f"{modeling.__name__}.apply_rotary_pos_emb_extra"]
        assert modeling.apply_rotary_pos_emb_extra is extra  # untouched


# --- training: one architecture per convention ------------------------------

TRAIN_STEPS = 3


def _train(model: nn.Module, name: str):
    from tests.test_e2e_training import run_steps

    batches = (tiny_batch(name, seed=10 + step, batch=1) for step in range(TRAIN_STEPS))
    # SGD: AdamW turns the float noise of a gradient that is zero in exact math (a key bias over
    # pass-through dims shifts every score of a query alike) into lr-sized steps of random sign
    return run_steps(model, ({**inputs, "labels": inputs["input_ids"]} for inputs in batches),
                     torch.optim.SGD(model.parameters(), lr=0.1))  # fmt: skip


@pytest.mark.parametrize(
    "name",
    [
        "phi3",  # partial rotary
        "cohere",  # GPT-J pairs
        "glm4",  # GPT-J pairs, halves tables, partial rotary
        "deepseek_v3",  # interleaved_to_halves
        "qwen2_vl",  # packed vision tokens; M-RoPE tables in the text model
    ],
)
def test_patched_training_matches_unpatched(hf, name):
    from tests.test_e2e_training import assert_same_training

    skip_unless_transformers_5(name)
    if runs_what_transformers_4_refuses(name):
        pytest.skip(f"{name} runs a rotary transformers 4 defines otherwise; the patch leaves it alone (checked above)")
    model = tiny_arch_model(hf, name).train()
    want = _train(copy.deepcopy(model), name)
    assert len(set(want.losses)) == TRAIN_STEPS, f"the model did not train: {want.losses}"
    with refusal_warnings(name):
        patch = apply_liger_ops(model)
    with patch:
        assert patch.report.rope_functions == expected_rope_functions(name), str(patch.report)
        assert_rope_refusals(name, patch.report)
        with LigerOpCounter() as counter:
            got = _train(model, name)
    layers = 2 if TINY[name][2] else 1
    want_calls = {"rope": TRAIN_STEPS * layers, "rope_backward": TRAIN_STEPS * layers}
    assert counter.calls == {**want_calls, **module_calls(patch.report, TRAIN_STEPS)}, counter.calls
    assert_same_training(got, want)


# --- M-RoPE: the op's own sections against transformers' ---------------------


@pytest.mark.parametrize(("arch", "interleaved"), [("qwen2_vl", False), ("qwen3_vl", True)])
def test_op_mrope_matches_transformers_rotary_embedding(hf, arch, interleaved):
    """transformers 5.17 composes M-RoPE's sections into gathered tables
    before the attention's rotate_half, so the patch needs no M-RoPE option.
    The op's own M-RoPE path (``mrope_section`` with (3, B, S) positions and
    (max_pos, R) tables) agrees with that composition (Qwen2-VL sections,
    Qwen3-VL interleaving)."""
    skip_unless_transformers_5(arch)
    import importlib

    modeling = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
    config_cls, rotary_cls = {
        "qwen2_vl": ("Qwen2VLTextConfig", "Qwen2VLRotaryEmbedding"),
        "qwen3_vl": ("Qwen3VLTextConfig", "Qwen3VLTextRotaryEmbedding"),
    }[arch]
    section = _VL_TEXT["rope_parameters"]["mrope_section"]
    config = getattr(hf, config_cls)(**copy.deepcopy(_VL_TEXT), head_dim=16)
    rotary = getattr(modeling, rotary_cls)(config).to(DEVICE)
    gen = torch.Generator().manual_seed(3)
    positions = torch.randint(0, 20, (3, 2, 6), generator=gen).to(DEVICE)
    q, k = torch.randn(2, 2, 6, 16, generator=gen).to(DEVICE), torch.randn(2, 1, 6, 16, generator=gen).to(DEVICE)
    cos, sin = rotary(q, positions)
    want = modeling.apply_rotary_pos_emb(q, k, cos, sin)
    freqs = torch.arange(20, device=DEVICE).float()[:, None] * rotary.inv_freq.float()[None]
    table_cos, table_sin = (f(torch.cat((freqs, freqs), dim=-1)) for f in (torch.cos, torch.sin))
    got = torch.ops.liger.rope(q, k, table_cos, table_sin, position_ids=positions, mrope_section=section,
                               mrope_interleaved=interleaved)  # fmt: skip
    for g, w in zip(got, want, strict=True):
        assert _rel(g, w) <= 1e-5


# --- no quiet zero: what apply_liger_ops cannot route, or routes to no caller, warns ---------

_FAKE_MODELING = """
import torch
from torch import nn


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class ByNameAttention(nn.Module):
    def forward(self, q, k, cos, sin):
        return apply_rotary_pos_emb(q, k, cos, sin)


class ByAttributeAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.rotary = apply_rotary_pos_emb  # bound now: a later swap of the global is never called

    def forward(self, q, k, cos, sin):
        return self.rotary(q, k, cos, sin)
"""


@pytest.fixture
def fake_modeling(monkeypatch):
    """A modeling module the patcher takes for transformers' (by its name), with
    Llama's rotary function and two attention classes: one calling it by name,
    one through an attribute bound at construction."""
    import sys
    import types

    name = "transformers.models.fakearch.modeling_fakearch"
    module = types.ModuleType(name)
    exec(compile(_FAKE_MODELING, name, "exec"), vars(module))
    monkeypatch.setitem(sys.modules, name, module)
    assert rope_patched_modules() == {}
    yield module
    assert rope_patched_modules() == {}


def test_rope_swap_the_model_calls_does_not_warn(fake_modeling, recwarn):
    with apply_liger_ops(fake_modeling.ByNameAttention(), rope_architectures=("fakearch",)) as patch:
        assert patch.report.rope_functions == [f"{fake_modeling.__name__}.apply_rotary_pos_emb"]
        assert patch.report.warnings == []
    assert not [w for w in recwarn if issubclass(w.category, liger_nn.LigerPatchWarning)]


def test_rope_swap_no_code_of_the_model_calls_warns(fake_modeling):
    model = fake_modeling.ByAttributeAttention()
    with pytest.warns(liger_nn.LigerPatchWarning, match="'fakearch'.*no code of the model's classes") as record:
        patch = apply_liger_ops(model, rope_architectures=("fakearch",))
    with patch:
        assert patch.report.rope_functions == [f"{fake_modeling.__name__}.apply_rotary_pos_emb"]
        assert str(record[0].message) in patch.report.warnings and "warnings 1:" in str(patch.report)
        gen = torch.Generator().manual_seed(0)
        q, k, cos, sin = (torch.randn(1, 2, 3, 4, generator=gen) for _ in range(4))
        with LigerOpCounter() as counter:
            model(q, k, cos[0], sin[0])
        assert counter.calls == {}, "the warning is right: the model does not run the op"


def test_rope_unknown_signature_warns_and_is_left_alone(fake_modeling, monkeypatch):
    original = fake_modeling.apply_rotary_pos_emb

    def wrapped(*args, **kwargs):  # what a decorator without functools.wraps leaves
        return original(*args, **kwargs)

    monkeypatch.setattr(fake_modeling, "apply_rotary_pos_emb", wrapped)
    with pytest.warns(liger_nn.LigerPatchWarning, match="'fakearch'.*not \\(fully\\) routed.*unknown signature"):
        patch = apply_liger_ops(fake_modeling.ByNameAttention(), rope_architectures=("fakearch",))
    with patch:
        assert patch.report.rope_functions == []
        assert fake_modeling.apply_rotary_pos_emb is wrapped
    # Outside the allow-list nothing is attempted: reported, not warned.
    with apply_liger_ops(fake_modeling.ByNameAttention(), rope_architectures=()) as patch:
        assert "allow-list" in patch.report.left_alone[0].detail and patch.report.warnings == []
