"""rope's options (issue 18): position lookups in the kernel (position_ids,
cu_seqlens for packed tokens), interleaved and DeepSeek pairs with partial
rotary, the single-tensor form and M-RoPE.  Against transformers' own
functions (the conventions), against the float64 reference (every dtype and
layout, forward, backward, in place), and out-of-range positions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from csrc_free_ops.rope import RopeOptions, launch, plan, reference
from tests.helpers import ALL_DTYPES, DEVICE, assert_close_to_ref, poison_like
from tests.rope_cases import HEAD_LAYOUTS, angle_table, make_heads, reference_variant_grads

F64 = torch.float64


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEVICE, dtype=dtype)


# --- The conventions, from transformers' sources (float64 in, float64 tolerance)


def test_interleaved_pairs_are_coheres_formula():
    """Cohere computes in float32 whatever the input (its formula upcasts with .float())."""
    from transformers.models.cohere.modeling_cohere import apply_rotary_pos_emb

    q, k = _randn(2, 4, 5, 16, dtype=F64), _randn(2, 2, 5, 16, dtype=F64)
    cos, sin = angle_table(5, 16, F64, "interleaved")
    want = apply_rotary_pos_emb(q, k, cos[None], sin[None])
    got = torch.ops.liger.rope(q, k, cos, sin, pairs="interleaved")
    for g, w in zip(got, want, strict=True):
        assert_close_to_ref(g, w, torch.float32)


def test_interleaved_partial_rotary_is_glm4s_formula():
    """GLM-4 rotates interleaved pairs of the first R of D dims; it builds the
    interleaved table from HF's cat(freqs, freqs) one."""
    from transformers.models.glm4.modeling_glm4 import apply_rotary_pos_emb

    q, k = _randn(2, 4, 5, 24, dtype=F64), _randn(2, 1, 5, 24, dtype=F64)
    cos, sin = angle_table(5, 12, F64)
    want = apply_rotary_pos_emb(q, k, cos[None], sin[None])
    cos_i, sin_i = (t[..., :6].repeat_interleave(2, dim=-1) for t in (cos, sin))
    got = torch.ops.liger.rope(q, k, cos_i, sin_i, pairs="interleaved")
    for g, w in zip(got, want, strict=True):
        assert_close_to_ref(g, w, F64)


def test_single_tensor_interleaved_is_gptjs_formula():
    """GPT-J rotates one tensor at a time, (B, S, H, D) with (B, S, R/2) sin/cos."""
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb

    x = _randn(2, 5, 3, 16, dtype=F64)
    cos, sin = angle_table(5, 16, F64, "interleaved")
    want = apply_rotary_pos_emb(x, sin[None, :, ::2].expand(2, 5, 8), cos[None, :, ::2].expand(2, 5, 8))
    got_q, got_k = torch.ops.liger.rope(x.transpose(1, 2), None, cos, sin, pairs="interleaved")
    assert got_k is None
    assert_close_to_ref(got_q.transpose(1, 2), want, F64)


def test_interleaved_to_halves_is_deepseek_v3s_rope_interleave():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb_interleave

    q, k = _randn(2, 4, 5, 16, dtype=F64), _randn(2, 1, 5, 16, dtype=F64)
    cos, sin = angle_table(5, 16, F64)
    want = apply_rotary_pos_emb_interleave(q, k, cos[None], sin[None])
    got = torch.ops.liger.rope(q, k, cos, sin, pairs="interleaved_to_halves")
    for g, w in zip(got, want, strict=True):
        assert_close_to_ref(g, w, F64)


def _qwen_vl_rotary(generation: int, head_dim: int, section: list[int]):
    if generation == 2:
        from transformers import Qwen2VLConfig
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding as Rotary

        rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section}
        config = Qwen2VLConfig(
            text_config={"hidden_size": 4 * head_dim, "num_attention_heads": 4, "rope_parameters": rope}
        )
    else:
        from transformers import Qwen3VLConfig
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding as Rotary

        rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section, "mrope_interleaved": True}
        text = {"hidden_size": 4 * head_dim, "num_attention_heads": 4, "head_dim": head_dim, "rope_parameters": rope}
        config = Qwen3VLConfig(text_config=text)
    return Rotary(config.text_config).to(DEVICE)


@pytest.mark.parametrize(("generation", "section"), [(2, [2, 3, 3]), (3, [4, 2, 2]), (3, [2, 3, 3])])
def test_mrope_matches_qwen_vl_rotary(generation, section):
    """Qwen2-VL's sections and Qwen3-VL's interleaving of the t/h/w position
    streams: HF's rotary module builds (B, S, D) cos/sin from (3, B, S)
    position ids; the op gathers the same from a (max_pos, D) table.  HF
    computes the angles in float32."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    head_dim, max_pos = 16, 40
    rotary = _qwen_vl_rotary(generation, head_dim, section)
    q, k = _randn(2, 4, 7, head_dim), _randn(2, 2, 7, head_dim)
    position_ids = torch.randint(0, max_pos, (3, 2, 7), device=DEVICE)
    cos, sin = rotary(q, position_ids)
    want = apply_rotary_pos_emb(q.double(), k.double(), cos.double(), sin.double())
    freqs = torch.arange(max_pos, device=DEVICE, dtype=torch.float32)[:, None] * rotary.inv_freq.float()
    table_cos, table_sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()
    options = {"position_ids": position_ids, "mrope_section": section, "mrope_interleaved": generation == 3}
    got = torch.ops.liger.rope(q, k, table_cos, table_sin, **options)
    ref = reference.forward(q.double(), k.double(), table_cos.double(), table_sin.double(), RopeOptions(**options))
    for g, r, w in zip(got, ref, want, strict=True):
        assert_close_to_ref(r, w, torch.float32, "reference vs HF")
        assert_close_to_ref(g, w, torch.float32, "op vs HF")


def test_packed_sequences_three_ways():
    """Three documents packed in 12 tokens: per-document HF rotation, position
    ids restarting at each document, and cu_seqlens agree."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    lengths = [5, 3, 4]
    q, k = _randn(12, 4, 8, dtype=F64), _randn(12, 2, 8, dtype=F64)
    cos, sin = angle_table(6, 8, F64)
    want_q, want_k = [], []
    start = 0
    for n in lengths:
        doc_q, doc_k = (x[start : start + n].transpose(0, 1)[None] for x in (q, k))
        wq, wk = apply_rotary_pos_emb(doc_q, doc_k, cos[None, :n], sin[None, :n])
        want_q.append(wq[0].transpose(0, 1))
        want_k.append(wk[0].transpose(0, 1))
        start += n
    want = (torch.cat(want_q), torch.cat(want_k))
    position_ids = torch.cat([torch.arange(n) for n in lengths]).to(DEVICE)
    cu_seqlens = torch.tensor([0, 5, 8, 12], dtype=torch.int32, device=DEVICE)
    for options in ({"position_ids": position_ids}, {"position_ids": position_ids[None]}, {"cu_seqlens": cu_seqlens}):
        got = torch.ops.liger.rope(q, k, cos, sin, **options)
        for g, w in zip(got, want, strict=True):
            assert_close_to_ref(g, w, F64, str(options.keys()))
    # B = 1 in (B, H, S, D) takes cu_seqlens too
    got = torch.ops.liger.rope(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin, cu_seqlens=cu_seqlens)
    assert_close_to_ref(got[0][0].transpose(0, 1), want[0], F64)


# --- Every variant against the float64 reference


@st.composite
def variants(draw):
    """A call: layout of q/k, which of them, where cos/sin come from, pairs, dtypes."""
    packed = draw(st.booleans())
    dim = draw(st.sampled_from([4, 6, 12, 16, 18]))
    rot = draw(st.sampled_from(sorted({dim, 2 * (dim // 4) or 2, 2})))
    batch = 1 if packed else draw(st.integers(1, 2))
    seq = draw(st.integers(1, 6))
    source = draw(st.sampled_from(["gathered", "position_ids", "cu_seqlens", "mrope"]))
    if source == "cu_seqlens":
        batch = 1
    dtype = draw(st.sampled_from(ALL_DTYPES))
    which = draw(st.sampled_from(["both", "q", "k"]))
    v = {"packed": packed, "dim": dim, "rot": rot, "batch": batch, "seq": seq, "source": source, "dtype": dtype,
         "table_dtype": draw(st.sampled_from(ALL_DTYPES)), "which": which,
         "pairs": draw(st.sampled_from(reference.PAIRS)), "n_qh": draw(st.integers(1, 5)),
         "n_kh": draw(st.integers(1, 3)),
         "layouts": (draw(st.sampled_from(HEAD_LAYOUTS)), draw(st.sampled_from(HEAD_LAYOUTS))),
         "max_pos": draw(st.integers(seq, seq + 4)), "mrope_interleaved": draw(st.booleans())}  # fmt: skip
    if source == "cu_seqlens":
        cuts = sorted(draw(st.lists(st.integers(0, seq), min_size=0, max_size=3)))
        v["cu_seqlens"] = [0, *cuts, seq]
    if source == "mrope":
        half = rot // 2
        t = draw(st.integers(0, half))
        h = draw(st.integers(0, half - t))
        v["mrope_section"] = [t, h, half - t - h]
    return v


def build_variant(v, device=DEVICE):
    """(q, k, cos, sin, options) for a drawn variant; q/k (T, H, D) when packed."""
    heads = []
    for n, layout in zip((v["n_qh"], v["n_kh"]), v["layouts"], strict=True):
        x = make_heads(v["batch"], n, v["seq"], v["dim"], v["dtype"], layout, device)
        heads.append(x[0].transpose(0, 1) if v["packed"] else x)  # (T, H, D) views
    q, k = heads
    if v["which"] == "k":  # k alone (a KV-cache append) goes first: rope(k, None, ...)
        q, k = k, None
    elif v["which"] == "q":
        k = None
    options = {"pairs": v["pairs"]}
    source = v["source"]
    if source == "gathered":
        shape = (v["seq"], v["rot"]) if v["packed"] else (v["batch"], v["seq"], v["rot"])
        cos, sin = (torch.randn(shape, device=device).to(v["table_dtype"]) for _ in range(2))
        return q, k, cos, sin, options
    cos, sin = (torch.randn(v["max_pos"], v["rot"], device=device).to(v["table_dtype"]) for _ in range(2))
    if source == "cu_seqlens":
        options["cu_seqlens"] = torch.tensor(v["cu_seqlens"], dtype=torch.int32, device=device)
    elif source == "position_ids":
        shape = (v["seq"],) if v["packed"] else (v["batch"], v["seq"])
        options["position_ids"] = torch.randint(0, v["max_pos"], shape, device=device)
    else:
        shape = (3, v["seq"]) if v["packed"] else (3, v["batch"], v["seq"])
        options["position_ids"] = torch.randint(0, v["max_pos"], shape, device=device, dtype=torch.int32)
        options["mrope_section"] = v["mrope_section"]
        options["mrope_interleaved"] = v["mrope_interleaved"]
    return q, k, cos, sin, options


def _both(f, *xs):
    return tuple(None if x is None else f(x) for x in xs)


@given(v=variants())
def test_every_variant_matches_float64_reference(v):
    """Forward, gradients (through rope_backward) and in place, against the
    float64 reference; NaN-free; outputs in their input's dtype and layout."""
    q, k, cos, sin, options = build_variant(v)
    leaves = _both(lambda t: t.detach().clone().requires_grad_(), q, k)
    grads_out = _both(torch.randn_like, q, k)
    outs = torch.ops.liger.rope(*leaves, cos, sin, **options)
    present = [(o, g, x) for o, g, x in zip(outs, grads_out, leaves, strict=True) if x is not None]
    grads = torch.autograd.grad([o for o, _, _ in present], [x for _, _, x in present], [g for _, g, _ in present])
    refs, ref_grads = reference_variant_grads(q, k, cos, sin, *grads_out, **options)
    it = iter(grads)
    for name, x, out, ref, ref_grad in zip("qk", (q, k), outs, refs, ref_grads, strict=True):
        if x is None:
            assert out is None and ref is None
            continue
        assert out.dtype == x.dtype and out.stride() == torch.empty_like(x).stride()
        assert_close_to_ref(out, ref, v["dtype"], f"{name}_out")
        assert_close_to_ref(next(it), ref_grad, v["dtype"], f"d{name}")
    inplace = _both(lambda t: t.clone(), q, k)
    torch.ops.liger.rope_(*inplace, cos, sin, **options)
    for name, x, ref in zip("qk", inplace, refs, strict=True):
        if x is not None:
            assert_close_to_ref(x, ref, v["dtype"], f"{name} (in place)")


def test_rows_outside_the_table_are_nan_on_the_gpu_path():
    """The GPU entries do not check positions (a device sync): a row whose
    position is outside [0, max_pos) reads nothing from the table and comes
    out NaN in its rotated dims; its pass-through dims and every other row are
    right.  Called below the op's CPU check, as CUDA runs."""
    q, k = _randn(1, 2, 4, 12), _randn(1, 1, 4, 12)
    cos, sin = angle_table(5, 8, torch.float32)
    position_ids = torch.tensor([[0, 5, -1, 4]], device=DEVICE)
    good = position_ids.clamp(0, 4)
    want = reference.forward(q.double(), k.double(), cos.double(), sin.double(), RopeOptions(position_ids=good))
    got = launch.cuda_forward(q, k, cos, sin, RopeOptions(position_ids=position_ids))
    for g, w in zip(got, want, strict=True):
        assert torch.isnan(g[:, :, 1:3, :8]).all() and not torch.isnan(g[:, :, 1:3, 8:]).any()
        assert_close_to_ref(g[:, :, 1:3, 8:], w[:, :, 1:3, 8:], torch.float32)
        assert_close_to_ref(g[:, :, [0, 3]], w[:, :, [0, 3]], torch.float32)
    # a sequence of cu_seqlens longer than the table: its tokens past max_pos
    packed = q[0].transpose(0, 1)
    got, _ = launch.cuda_forward(packed, None, cos, sin, RopeOptions(cu_seqlens=torch.tensor([0, 4, 4], device=DEVICE)))
    assert torch.isnan(got[:, :, :8]).any(dim=(1, 2)).tolist() == [False, False, False, False]
    short_cos, short_sin = angle_table(3, 8, torch.float32)
    bounds = RopeOptions(cu_seqlens=torch.tensor([0, 4], device=DEVICE))
    got, _ = launch.cuda_forward(packed, None, short_cos, short_sin, bounds)
    assert torch.isnan(got[:, :, :8]).all(dim=2).all(dim=1).tolist() == [False, False, False, True]


def test_sequence_starts_are_searched_in_chunks():
    """More cu_seqlens entries than one step of the search holds: the launch
    sequence with a plan of 4-entry steps, NaN-poisoned outputs."""
    lengths = [1, 3, 2, 2, 1, 4, 2, 1, 3]
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64, device=DEVICE)
    tokens = int(bounds[-1])
    q, k = _randn(tokens, 3, 8), _randn(tokens, 2, 8)
    cos, sin = angle_table(4, 8, torch.float32)
    p = plan.Plan(block_qh=4, block_kh=2, programs=tokens, num_warps=1, block_seqs=4, split_pairs=True)
    qo, ko = poison_like(q), poison_like(k)
    options = RopeOptions(cu_seqlens=bounds, pairs="interleaved")
    launch.rotate(q, k, qo, ko, cos, sin, p, backward=False, options=options)
    want = reference.forward(q.double(), k.double(), cos.double(), sin.double(), options)
    assert_close_to_ref(qo, want[0], torch.float32, "q_out")
    assert_close_to_ref(ko, want[1], torch.float32, "k_out")


def test_interleaved_pairs_read_with_strided_loads_or_split_tiles():
    """Both ways of reading interleaved pairs (CUDA's split tile, the NPU's
    stride-2 loads) through the launch sequence, in place and out of place."""
    q, k = _randn(2, 3, 4, 20), _randn(2, 2, 4, 20)
    cos, sin = angle_table(4, 12, torch.float32, "interleaved")
    for split in (True, False):
        p = plan.Plan(block_qh=2, block_kh=1, programs=3, num_warps=1, split_pairs=split)  # heads and rows loops
        for pairs in ("interleaved", "interleaved_to_halves"):
            want = reference.forward(q.double(), k.double(), cos.double(), sin.double(), RopeOptions(pairs=pairs))
            qo, ko = poison_like(q), poison_like(k)
            launch.rotate(q, k, qo, ko, cos, sin, p, backward=False, options=RopeOptions(pairs=pairs))
            assert_close_to_ref(qo, want[0], torch.float32, f"q_out split={split} {pairs}")
            assert_close_to_ref(ko, want[1], torch.float32, f"k_out split={split} {pairs}")
            qi, ki = q.clone(), k.clone()
            launch.forward_(qi, ki, cos, sin, p, RopeOptions(pairs=pairs))
            assert_close_to_ref(qi, want[0], torch.float32, f"q in place split={split} {pairs}")


def test_gradcheck_and_gradgradcheck_of_the_variants_in_float64():
    """Fast mode (random projections of the Jacobians)."""
    q, k = _randn(5, 2, 6, dtype=F64).requires_grad_(), _randn(5, 1, 6, dtype=F64).requires_grad_()
    cos, sin = _randn(4, 4, dtype=F64), _randn(4, 4)
    cases = [
        (q, None, {"cu_seqlens": torch.tensor([0, 2, 5], device=DEVICE), "pairs": "interleaved_to_halves"}),
        (k, None, {"position_ids": torch.tensor([3, 0, 1, 2, 2], device=DEVICE), "pairs": "interleaved"}),
        (q, k, {"position_ids": torch.randint(0, 4, (3, 5), device=DEVICE), "mrope_section": [1, 0, 1],
                "mrope_interleaved": True}),
    ]  # fmt: skip
    for q_, k_, options in cases:  # k alone goes first
        inputs = tuple(t for t in (q_, k_) if t is not None)

        def fn(*xs, options=options):
            args = (xs[0], None) if len(xs) == 1 else xs
            return tuple(o for o in torch.ops.liger.rope(*args, cos, sin, **options) if o is not None)

        assert torch.autograd.gradcheck(fn, inputs, fast_mode=True), options
    # Second order: rope_backward's own backward (rope) with every option at once.
    assert torch.autograd.gradgradcheck(fn, inputs, fast_mode=True), options


# --- Bad input


def _call(op, q=(2, 4, 5, 8), k=(2, 2, 5, 8), table=(16, 8), **options):
    make = {"q": q, "k": k}
    tensors = [None if s is None else _randn(*s) for s in (make["q"], make["k"])]
    cos, sin = _randn(*table), _randn(*table)
    on_device = {n: v.to(DEVICE) if isinstance(v, torch.Tensor) and not v.is_meta else v for n, v in options.items()}
    getattr(torch.ops.liger, op)(*tensors, cos, sin, **on_device)


IDS = torch.zeros(2, 5, dtype=torch.int64)
BAD_OPTIONS = [
    (ValueError, "pairs must be one of 'halves', 'interleaved', 'interleaved_to_halves', got 'neox'",
     {"pairs": "neox", "table": (5, 8)}),
    (ValueError, "pass position_ids or cu_seqlens, not both",
     {"position_ids": IDS, "cu_seqlens": torch.tensor([0, 5])}),
    (TypeError, "position_ids must be int32 or int64, got torch.float32", {"position_ids": IDS.float()}),
    (TypeError, "cu_seqlens must be int32 or int64", {"cu_seqlens": torch.tensor([0.0, 5.0]), "q": (1, 4, 5, 8),
                                                       "k": (1, 2, 5, 8)}),
    (ValueError, r"position_ids must have shape \(2, 5\) or \(1, 5\) or \(5,\), got \(2, 6\)",
     {"position_ids": torch.zeros(2, 6, dtype=torch.int64)}),
    (ValueError, r"position_ids must have shape \(3, 2, 5\)", {"position_ids": IDS, "mrope_section": [2, 1, 1]}),
    (ValueError, r"mrope_section must be 3 non-negative sizes \[t, h, w\] summing to R/2 = 4, got \[2, 1, 2\]",
     {"position_ids": torch.zeros(3, 2, 5, dtype=torch.int64), "mrope_section": [2, 1, 2]}),
    (ValueError, "mrope_section needs position_ids", {"mrope_section": [2, 1, 1], "table": (5, 8)}),
    (ValueError, "mrope_interleaved=True needs mrope_section", {"mrope_interleaved": True, "table": (5, 8)}),
    (ValueError, r"cos/sin are \(max_pos, R\) tables, got shape \(1, 16, 8\)",
     {"position_ids": IDS, "table": (1, 16, 8)}),
    (ValueError, "cu_seqlens needs packed tokens, \\(T, H, D\\) or batch 1, got batch 2",
     {"cu_seqlens": torch.tensor([0, 5])}),
    (ValueError, "cu_seqlens must be 1-D with at least 2 entries", {"cu_seqlens": torch.tensor([0]), "q": (5, 4, 8),
                                                                     "k": (5, 2, 8)}),
    (ValueError, r"cos/sin must have shape \(T, R\) or \(1, T, R\) for packed tokens, got \(2, 5, 8\)",
     {"q": (5, 4, 8), "k": (5, 2, 8), "table": (2, 5, 8)}),
    (ValueError, "q and k must have the same token count, got 5 and 6",
     {"q": (5, 4, 8), "k": (6, 2, 8), "table": (5, 8)}),
    (ValueError, "position_ids is on meta", {"position_ids": IDS.to("meta")}),
]  # fmt: skip


@pytest.mark.parametrize(("error", "message", "call"), BAD_OPTIONS)
@pytest.mark.parametrize("op", ["rope", "rope_backward", "rope_"])
def test_bad_options_raise_clear_errors(op, error, message, call):
    if op == "rope_backward":  # the backward op names its tensors dq and dk
        message = message.replace("q and k", "dq and dk")
    with pytest.raises(error, match=rf"liger\.{op}: .*{message}"):
        _call(op, **call)


OUT_OF_RANGE = [
    ({"position_ids": torch.tensor([[0, 1, 2, 3, 16]] * 2)}, r"position_ids must lie in \[0, 16\).*from 0 to 16"),
    ({"position_ids": torch.tensor([[0, -1, 2, 3, 4]] * 2)}, r"position_ids must lie in \[0, 16\).*from -1 to 4"),
    ({"position_ids": torch.full((3, 2, 5), 20), "mrope_section": [2, 1, 1]}, r"position_ids must lie in \[0, 16\)"),
    ({"cu_seqlens": torch.tensor([1, 5]), "q": (5, 4, 8), "k": (5, 2, 8)},
     "cu_seqlens must rise from 0 to the token count 5"),
    ({"cu_seqlens": torch.tensor([0, 4]), "q": (5, 4, 8), "k": (5, 2, 8)}, "cu_seqlens must rise from 0"),
    ({"cu_seqlens": torch.tensor([0, 4, 3, 5]), "q": (5, 4, 8), "k": (5, 2, 8)}, "cu_seqlens must rise from 0"),
    ({"cu_seqlens": torch.tensor([0, 5]), "q": (5, 4, 8), "k": (5, 2, 8), "table": (4, 8)},
     "a sequence of cu_seqlens has 5 tokens, more than the 4 rows of cos/sin"),
]  # fmt: skip


@pytest.mark.skipif(DEVICE != "cpu", reason="positions are checked on the CPU paths only")
@pytest.mark.parametrize(("call", "message"), OUT_OF_RANGE)
@pytest.mark.parametrize("op", ["rope", "rope_backward", "rope_"])
def test_positions_outside_the_table_raise_on_cpu(op, call, message):
    with pytest.raises(ValueError, match=rf"liger\.{op}: {message}"):
        _call(op, **call)


# --- torch.func over the options


def test_vmap_and_jvp_over_the_options():
    """vmap over q and k with looked-up positions (folded into one call, or
    per sample with cu_seqlens), k alone, M-RoPE; jvp by linearity."""
    from torch.func import jvp, vmap

    n, cos, sin = 3, *angle_table(8, 8, torch.float32, "interleaved")
    q, k = _randn(n, 2, 4, 5, 8), _randn(n, 2, 2, 5, 8)
    ids = torch.randint(0, 8, (2, 5), device=DEVICE)
    mrope_ids = torch.randint(0, 8, (3, 2, 5), device=DEVICE)
    packed = _randn(n, 6, 2, 8)
    cu_seqlens = torch.tensor([0, 2, 6], device=DEVICE)
    cases = [
        ((q, k), {"position_ids": ids, "pairs": "interleaved"}),
        ((q, None), {"position_ids": mrope_ids, "mrope_section": [2, 1, 1], "mrope_interleaved": True}),
        ((packed, None), {"cu_seqlens": cu_seqlens, "pairs": "interleaved_to_halves"}),
    ]
    for (x, y), options in cases:

        def call(x, y, options=options):  # vmap takes tensor outputs only: a single tensor's None is dropped
            return tuple(o for o in torch.ops.liger.rope(x, y, cos, sin, **options) if o is not None)

        in_dims = (0, None if y is None else 0)
        got = vmap(call, in_dims=in_dims)(x, y)
        for i in range(n):
            want = reference.forward(x[i].double(), None if y is None else y[i].double(), cos.double(), sin.double(),
                                     RopeOptions(**options))  # fmt: skip
            want = [w for w in want if w is not None]
            for g, w in zip(got, want, strict=True):
                assert_close_to_ref(g[i], w, torch.float32, f"vmap {sorted(options)}")
        tangent = torch.randn_like(x[0])
        _, out_tangent = jvp(lambda t, options=options, y=y: call(t, None if y is None else y[0])[0], (x[0],),
                             (tangent,))  # fmt: skip
        want = reference.forward(tangent.double(), None, cos.double(), sin.double(), RopeOptions(**options))[0]
        assert_close_to_ref(out_tangent, want, torch.float32, f"jvp {sorted(options)}")
