"""The float workspace group_norm's multi-program paths exchange partials
and statistics through: which rows it holds, and the row sets each path
uses.  (Memory format, the other "layout", is layout.py's.)"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Workspace:
    """The rows of the float workspace, in the compute dtype: one row per name of
    ``segment``, each holding one value per segment (sample, spatial segment,
    channel) laid out (N, splits, C), then one row per name of ``stats``,
    each holding one value per (sample, group).  Kernels take a segment row's
    index as the constexpr NAME_ROW (``rows``) and the first stats row's
    as STATS_ROW."""

    segment: tuple[str, ...] = ()
    stats: tuple[str, ...] = ()

    def rows(self, *names: str) -> tuple[tuple[str, int], ...]:
        return tuple((f"{name.upper()}_ROW", self.segment.index(name)) for name in names)

    def elements(self, segments: int, groups: int) -> int:
        return len(self.segment) * segments + len(self.stats) * groups


NO_WORKSPACE = Workspace()
# Per-segment partials of the split and one-pass paths: a segment's
# per-channel mean and M2, and backward sum(dy) (also the dbias term),
# sum(dy * (x - segment mean)) and the dweight term sum(dy * xhat).
FWD_PARTIALS = Workspace(("mean", "m2"))
BWD_PARTIALS = Workspace(("mean", "m2", "sum_dy", "sum_dy_d", "dweight"))
# The nhwc team paths backward: per (sample, segment, group) partials (in each segment row's first
# num_groups slots: mean, M2, sum(g), sum(g * (x - mean))), then each channel's dweight and dbias terms.
NHWC_TEAM_BWD = Workspace(("mean", "m2", "sum_g", "sum_gd", "dweight", "sum_dy"))
# The finalize kernels' per-(sample, group) statistics.
FWD_STATS = ("mean", "rstd")
BWD_STATS = ("mean", "rstd", "mean_g", "mean_gxhat")
# Whole and looped backward: each (sample, channel)'s dweight and dbias terms.
PARAM_TERMS = Workspace(("dweight", "sum_dy"))
