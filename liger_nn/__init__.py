"""User-facing drop-ins over ``torch.ops.liger``: nn.Modules and functions
with the signatures of the layers they replace."""

import registrations  # noqa: F401  (defines torch.ops.liger.*)
from liger_nn.glu import GEGLU, GeGLUMLP, SwiGLUMLP, geglu, geglu_exact, swiglu
from liger_nn.group_norm import GroupNorm
from liger_nn.hf_rotary import (
    apply_rotary_pos_emb_glm,
    apply_rotary_pos_emb_interleave,
    apply_rotary_pos_emb_interleaved,
    apply_rotary_pos_emb_vision,
)
from liger_nn.layer_norm import LayerNorm
from liger_nn.lm_head_loss import causal_lm_loss
from liger_nn.patching import LigerPatch, LigerPatchWarning, PatchReport, Replacement, apply_liger_ops
from liger_nn.poly_norm import PolyNorm
from liger_nn.rms_norm import RMSNorm
from liger_nn.rope import apply_rotary_pos_emb

__all__ = [
    "GEGLU",
    "GeGLUMLP",
    "GroupNorm",
    "LayerNorm",
    "LigerPatch",
    "LigerPatchWarning",
    "PatchReport",
    "PolyNorm",
    "RMSNorm",
    "Replacement",
    "SwiGLUMLP",
    "apply_liger_ops",
    "apply_rotary_pos_emb",
    "apply_rotary_pos_emb_glm",
    "apply_rotary_pos_emb_interleave",
    "apply_rotary_pos_emb_interleaved",
    "apply_rotary_pos_emb_vision",
    "causal_lm_loss",
    "geglu",
    "geglu_exact",
    "swiglu",
]
