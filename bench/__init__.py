"""Benchmark harness and demo for the ``torch.ops.liger`` ops.

Top layer: everything here calls the ops through ``torch.ops.liger`` (after
importing ``registrations``), never the kernel launchers.  Entry points:

* ``python -m bench.run``            speed / bandwidth / memory records, plots, summary
* ``python -m bench.host_overhead``  host cost of tiny calls, every path side by side
* ``python -m bench.steps``          whole training steps of real models per provider and mode
* ``python -m bench.demo``           every op checked against float64 and timed

The plan probes, the tree-against-tree driver and the lab notes are in ``bench.lab``.
"""
