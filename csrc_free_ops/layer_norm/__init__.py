"""LayerNorm over the last dim: y = (x - mean) * rsqrt(var + eps) * weight + bias
(biased variance), weight and bias each optional.

The rooms every op package has, each meaning the same in every op:

* ``reference.py``: pure PyTorch, the ground truth and the CPU fallback;
* ``kernels.py``: the kernels, which are RMSNorm's row-norm kernels run with
  the mean subtracted (CENTER);
* ``plan.py``: the ``Plan`` type and the CUDA and NPU planning functions
  (RMSNorm's: the two ops read and write the same bytes per row);
* ``launch.py``: each dispatch key's entry over the shared launch sequence.
"""
