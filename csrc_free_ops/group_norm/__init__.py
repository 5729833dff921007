"""GroupNorm: per (sample, group) standardisation with a per-channel affine.

``reference.py`` is the pure-PyTorch ground truth, ``kernels.py`` holds the
Triton kernels (shared by both backends), ``plan.py`` the work decomposition,
and ``cuda.py`` / ``npu.py`` the launch policy of each backend.
"""
