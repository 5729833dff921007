"""LayerNorm's kernels are the row-norm kernels of ``csrc_free_ops/rms_norm/kernels.py``
launched with CENTER=True (the mean subtracted, one read of x forward and of
x and grad_out backward all the same), OFFSET=0 and ROUND_NORMED=False
(torch.nn.functional.layer_norm rounds y once)."""

from csrc_free_ops.rms_norm.kernels import (  # noqa: F401
    bwd_blocked_kernel,
    bwd_tile_kernel,
    fwd_blocked_kernel,
    fwd_tile_kernel,
    reduce_param_grads_kernel,
)
