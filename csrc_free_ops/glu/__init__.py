"""Gated linear units, the elementwise part of a gated MLP:
y = act(gate) * up, with act = silu (SwiGLU: Llama, Mistral, Qwen) or
gelu(approximate='tanh') (GeGLU: Gemma).  The projections stay matmuls;
these kernels fuse the activation, the product and their backward.

One package for both ops: their kernels differ only in the activation and
its derivative (an ACTIVATION constexpr).  The rooms every op package has:

* ``reference.py``: pure PyTorch, the ground truth and the CPU fallback;
* ``kernels.py``: every ``@triton.jit`` of the ops, shared by CUDA and the NPU;
* ``plan.py``: the ``Plan`` type and the CUDA and NPU planning functions;
* ``launch.py``: the launch sequence (a Plan as data) and each dispatch
  key's entry.
"""
