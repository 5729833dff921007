"""PolyNorm: y = w0*norm(x^3) + w1*norm(x^2) + w2*norm(x) + b over the last dim,
norm(u) = u * rsqrt(mean(u^2) + eps).

The rooms every op package has, each meaning the same in every op:

* ``reference.py``: pure PyTorch, the ground truth and the CPU fallback;
* ``kernels.py``: every ``@triton.jit`` of the op, shared by CUDA and the NPU;
* ``plan.py``: the ``Plan`` type and the CUDA and NPU planning functions;
* ``launch.py``: the launch sequence (a Plan as data) and each dispatch
  key's entry.
"""
