"""LayerNorm's launch plans are RMSNorm's (``csrc_free_ops/rms_norm/plan.py``):
the same tiles and grids, since both read and write the same bytes per row
and LayerNorm's mean is one more reduction over the row a tile holds."""

from csrc_free_ops.rms_norm.plan import Plan, cuda, npu  # noqa: F401
