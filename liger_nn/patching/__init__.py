"""Swap this project's ops into a loaded model: ``apply_liger_ops(model)``.

What is replaced (each kind can be switched off; docs/patching.md has the tables):

* ``rope``: the module-level rotary functions (``apply_rotary_pos_emb``, and
  where an architecture has them ``apply_rotary_pos_emb_vision`` and
  ``apply_rotary_pos_emb_interleave``) of the transformers modeling modules
  the model's classes come from, for the architectures in
  ``ROPE_ARCHITECTURES``.  ``ROPE_FUNCTIONS`` names each function's
  convention (``ROPE_CONVENTIONS``: rotate_half, partial rotary, GPT-J pairs,
  GLM's, DeepSeek's interleave, packed vision tokens), i.e. which drop-in of
  ``liger_nn`` replaces it and with which options of the op.  The attention
  ``forward`` looks the name up in its module's globals on every call, so the
  swap is **process-wide for that architecture**: every model of the
  architecture in the process uses the op until the last handle that patched
  it is removed.  transformers offers no per-instance hook for these
  functions: its class-level patch mapping acts only while a model is
  created, and ``kernels.kernelize`` replaces the forward of the module
  object one architecture's models share (``liger_nn.hub`` offers the op to
  it).  With ``kernels`` installed, the decorated functions are such module
  objects; ``hub_function`` reads the function behind one.
* ``group_norm``: every submodule whose class is exactly ``torch.nn.GroupNorm``
  (subclasses are left alone) becomes a ``liger_nn.GroupNorm`` holding the
  *same* Parameter objects (an optimizer built earlier keeps working), so
  ``state_dict`` keys, dtypes and devices are unchanged.  Per model.
* ``group_norm_silu``: every diffusers ``ResnetBlock2D`` whose norms are
  GroupNorms and whose nonlinearity is SiLU runs each norm -> SiLU pair as
  one ``group_norm(..., activation="silu")`` call.  Per model.
* ``poly_norm``: every submodule whose class name contains ``PolyNorm`` and
  that has ``weight`` of shape (3,), a one-element ``bias`` and a float
  ``eps`` becomes a ``liger_nn.PolyNorm`` sharing those parameters.  Per model.
* ``glu``: every submodule with ``gate_proj``, ``up_proj``, ``down_proj``
  ``nn.Linear`` children and an ``act_fn`` that is SiLU or GELU's tanh
  approximation (transformers' ``LlamaMLP``, ``MistralMLP``, ``Qwen2MLP``,
  ``GemmaMLP``, ...) becomes a ``liger_nn.SwiGLUMLP`` / ``GeGLUMLP`` holding
  the same Linear modules: the projections stay matmuls, the elementwise
  part is one ``swiglu`` / ``geglu`` call; and every diffusers ``GEGLU`` (the
  feed-forward of SD 1.5's and SDXL's transformer blocks, exact GELU) becomes
  a ``liger_nn.GEGLU`` holding the same ``proj`` Linear, its halves one
  ``geglu_exact`` call.  Per model.
* ``rms_norm``: every submodule whose class name ends in ``RMSNorm`` with a
  1-D ``weight`` and a float epsilon becomes a ``liger_nn.RMSNorm`` sharing
  the weight, with the offset and casting mode whose reference reproduces
  the class's own bfloat16 output bit for bit (Llama's, OLMo2's, Gemma's
  ``1 + weight``).  Per model.
* ``layer_norm``: every submodule whose class is exactly ``torch.nn.LayerNorm``
  becomes a ``liger_nn.LayerNorm`` sharing its parameters; by default
  (``layer_norm=None``) not inside a diffusers module, whose LayerNorms leave no GPU
  time to win and cost less host time as torch's own op (the report lists them
  as left alone; ``layer_norm=True`` swaps them too).  Per model.
* ``fused_linear_cross_entropy``: the loss of every ``*ForCausalLM`` of an
  architecture in ``LOSS_ARCHITECTURES``: training steps with labels run the
  base model, then the fused loss on the hidden states and the LM head, and
  return no logits (``liger_nn.lm_head_loss``).  Per model.

Before anything is swapped, each candidate is checked numerically against its
original on tiny float32 CPU inputs; a candidate that disagrees is left alone
and the report says why.  The returned ``LigerPatch`` reports what was replaced
and what was left alone, and undoes everything with ``remove()`` or on leaving
a ``with`` block.  No quiet zero: a rotary of an allowed architecture left
alone, or a swapped one that no code of the model's classes names (a static
check of their bytecode, no forward), raises a ``LigerPatchWarning``.

One module per job: ``apply`` (the kinds in order), ``handle``, ``report``,
``checks``; rope's ``rope_table`` (the convention table), ``rope_dropin``,
``rope_check``, ``swap_rope``, ``global_swaps`` (the refcounted process-wide
swap), ``bytecode_scan``, ``hf_modules``; the module swaps ``module_swaps``
with one ``swap_<op>`` each (``swap_glu`` for the gated MLPs, ``swap_diffusers_geglu`` for
diffusers' GEGLU, ``swap_rms_norm`` and
``swap_layer_norm`` for the row norms); the loss's ``swap_causal_lm_loss``; the
diffusers fusion ``fuse_group_norm_silu``.
"""

from liger_nn.patching.apply import MODULE_RULES, apply_liger_ops
from liger_nn.patching.handle import LigerPatch
from liger_nn.patching.hf_modules import TESTED_TRANSFORMERS_VERSIONS, hub_function
from liger_nn.patching.module_swaps import ModuleRule
from liger_nn.patching.report import LigerPatchWarning, PatchReport, Replacement
from liger_nn.patching.rope_table import ROPE_ARCHITECTURES, ROPE_CONVENTIONS, ROPE_FUNCTIONS, RotaryConvention
from liger_nn.patching.swap_rope import rope_patched_modules

__all__ = [
    "MODULE_RULES",
    "ROPE_ARCHITECTURES",
    "ROPE_CONVENTIONS",
    "ROPE_FUNCTIONS",
    "TESTED_TRANSFORMERS_VERSIONS",
    "LigerPatch",
    "LigerPatchWarning",
    "ModuleRule",
    "PatchReport",
    "Replacement",
    "RotaryConvention",
    "apply_liger_ops",
    "hub_function",
    "rope_patched_modules",
]
