"""Fused linear cross-entropy: cross_entropy(x @ weight.T + bias, target)
without holding the (BT, V) logits.  The rows are taken in chunks: each
chunk's logits are one matmul (cuBLAS on CUDA, torch_npu's on the NPU),
then cross_entropy's kernels run on them, and their gradient, written in
place, gives grad_x and grad_weight with two more matmuls: in the forward
walk of a training step (forward_with_grads), or in a backward that
computes each chunk's logits again.

Rooms, as in every op package:

* ``reference.py``: pure PyTorch, the ground truth and the CPU fallback;
* ``kernels.py``: none of its own: cross_entropy's per-row kernels;
* ``plan.py``: the chunk size, from the sizes and the free memory;
* ``launch.py``: the chunk loops and each dispatch key's entry.
"""
