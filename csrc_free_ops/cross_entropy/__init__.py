"""Cross-entropy over the last dim of logits (BT, V) with hard targets (BT,),
upstream Liger-Kernel's options: ignore_index, label_smoothing, reduction
(mean, sum, none), lse_square_scale (z-loss), softcap and per-class weights.
With s = softcap * tanh(logits / softcap) (s = logits without softcap),
lse = logsumexp(s), w the class weights (ones without), V classes:

    loss_row = (1 - ls) * w[y] * (lse - s[y]) + ls / V * sum_c w[c] * (lse - s[c])
    z_row    = lse_square_scale * lse^2

Rooms, as in every op package:

* ``reference.py``: pure PyTorch, the ground truth and the CPU fallback;
* ``kernels.py``: the per-row forward (online softmax: loss, z-loss, lse) and
  backward (the logits' gradient, optionally in place), shared by CUDA and
  the NPU and by fused_linear_cross_entropy's chunks;
* ``plan.py``: the ``Plan`` type and the CUDA and NPU planning functions;
* ``launch.py``: the launch sequence and each dispatch key's entry.
"""
