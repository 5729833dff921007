"""fused_linear_cross_entropy has no kernel of its own: its launch runs
cross_entropy's per-row kernels (csrc_free_ops/cross_entropy/kernels.py) on
each chunk of logits, the backward one in place in the chunk's buffer."""

from csrc_free_ops.cross_entropy.kernels import backward_kernel, forward_kernel

__all__ = ["backward_kernel", "forward_kernel"]
