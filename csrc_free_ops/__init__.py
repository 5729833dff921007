"""Fused Triton kernels and their launchers (no C++).

One subpackage per op, each holding ``reference.py`` (pure PyTorch, the
ground truth), ``cuda.py`` (kernels and launchers for NVIDIA GPUs) and
``npu.py`` (kernels and launchers for Ascend NPUs).  Nothing here knows about
torch.library; ``registrations`` binds these launchers to ``torch.ops.liger``.
"""

__version__ = "0.1.0"
