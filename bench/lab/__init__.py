"""The bench's lab: plan probes, the tree-against-tree driver, the notes and the dated results.

Tools for whoever tunes a kernel, not for users: ``python -m bench.lab.probe_group_norm``,
``python -m bench.lab.probe_rope_layout``, ``python -m bench.lab.compare_trees`` (bench/lab/README.md).
"""
