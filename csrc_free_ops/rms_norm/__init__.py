"""RMSNorm over the last dim: y = norm(x) * (offset + weight),
norm(x) = x * rsqrt(mean(x^2) + eps), in transformers' two casting modes
(options.py): "llama" rounds norm(x) to x's dtype before the weight,
"gemma" keeps everything in float32 and rounds y once.

The rooms every op package has, each meaning the same in every op:

* ``reference.py``: pure PyTorch, the ground truth and the CPU fallback;
* ``kernels.py``: every ``@triton.jit`` of the op, shared by CUDA and the NPU
  (and by LayerNorm, which runs them with the mean subtracted);
* ``plan.py``: the ``Plan`` type and the CUDA and NPU planning functions;
* ``launch.py``: the launch sequence (a Plan as data) and each dispatch
  key's entry.

``options.py`` holds the bundle of the op's scalar options.
"""
