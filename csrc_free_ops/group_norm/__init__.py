"""GroupNorm: for x of shape (N, C, *) in G groups of C // G channels,
y = (x - mean) * rsqrt(var + eps) * weight + bias, with the mean and
(biased) variance of each (sample, group) over its channels and positions,
and weight and bias per channel.

The rooms every op package has, each meaning the same in every op:

* ``reference.py``: pure PyTorch, the ground truth and the CPU fallback;
* ``kernels.py``: every ``@triton.jit`` of the op (the one-pass kernels are
  CUDA-only, the rest shared by CUDA and the NPU) but the nhwc path's,
  which ``nhwc_kernels.py`` holds (CUDA-only: channels-last x read by whole
  pixel rows);
* ``plan.py``: the ``Plan`` type and the CUDA and NPU planning functions
  (helped by ``workspace.py``, ``tiles.py``, ``residency.py`` and
  ``npu_budget.py``; ``layout.py`` holds the memory formats);
* ``launch.py``: the launch sequence (a Plan as data) and each dispatch
  key's entry.
"""
