"""DTensor results of every op and backward op, and training under tensor
parallelism and FSDP2, in real processes (gloo on CPU, spawned), against the
single-process result on the full tensors (tests/dist/).

Three process groups, each spawned once for the cases it runs:

* kernels-2: two processes running the Triton kernels under the interpreter,
  one or two cases per op (forward and backward);
* reference-2 and reference-4: two and four processes on the pure-PyTorch
  CPU path (the interpreter is too slow for every case): every op case, and
  at world size 2 the TP tiny-Llama and FSDP2 training checks.

The same cases run on GPUs with NCCL under torchrun: ``nox -s multigpu``.
"""

from __future__ import annotations

import json

import pytest
import torch.multiprocessing as mp

from csrc_free_ops import interpreter
from tests.dist import op_cases, suites
from tests.dist.harness import spawn_worker

KERNEL_CASES = (
    "poly_norm/rows",
    "rope/heads_gqa",
    "rope/sequence_table_sharded",
    "rope_/sequence",
    "group_norm/batch_3d",
    "group_norm/channels_whole_groups",
    "swiglu/tensor_parallel",
    "geglu/sequence",
    "rms_norm/sequence",
    "layer_norm/sequence",
    "cross_entropy/rows_none",
    "fused_linear_cross_entropy/rows_sum",
)
GROUPS = {
    # name: (world size, Triton interpreter, case names)
    "kernels-2": (2, True, KERNEL_CASES),
    "reference-2": (2, False, tuple(name for name, _ in suites.all_cases(2))),
    "reference-4": (4, False, tuple(name for name, _ in op_cases.cases(4))),
}
# Cases this torch cannot run: skipped, and kept out of the workers, since a rank
# stops at its first failing case and would leave the cases after it unrun.
UNSUPPORTED = (
    {"tp_llama/dtensor_heads": "torch 2.11's DTensor cannot run transformers' attention matmul on head-sharded q/k/v"}
    if op_cases.TORCH_BEFORE_2_12
    else {}
)
_RESULTS: dict[str, list[dict]] = {}


def _run(group: str, tmp_path_factory) -> list[dict]:
    if group not in _RESULTS:
        world_size, interpret, names = GROUPS[group]
        out = tmp_path_factory.mktemp(group)
        names = [name for name in names if name not in UNSUPPORTED]
        mp.spawn(spawn_worker, args=(world_size, str(out / "store"), str(out), names, interpret),
                 nprocs=world_size)  # fmt: skip
        _RESULTS[group] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world_size)]
    return _RESULTS[group]


@pytest.mark.parametrize("group,name", [(group, name) for group, (_, _, names) in GROUPS.items() for name in names])
def test_case(group, name, tmp_path_factory):
    interpret = GROUPS[group][1]
    if interpret and interpreter.blocker():
        pytest.skip(interpreter.blocker())
    if name in UNSUPPORTED:
        pytest.skip(UNSUPPORTED[name])
    ranks = _run(group, tmp_path_factory)
    for rank, seen in enumerate(ranks):
        assert seen["interpreter"] == interpret, f"rank {rank} ran the {'reference' if interpret else 'kernels'}"
        error = seen["results"][name]
        assert error is None, f"rank {rank}:\n{error}"


def test_kernel_cases_cover_every_op():
    ops = {name.split("/")[0] for name in KERNEL_CASES}
    assert ops == {name.split("/")[0] for name, _ in op_cases.cases(2)}


def test_a_rank_stops_at_its_first_failing_case():
    """A rank that went on after a failure would issue the next case's
    collectives while its peers may still be in the failed one's: gloo then
    aborts every process on the mismatch (tests/dist/harness.py)."""
    import torch

    from tests.dist.harness import Context, run_cases

    ran = []

    def case(name, fail=False):
        def run(ctx):
            ran.append(name)
            if fail:
                raise AssertionError(f"{name} failed")

        return name, run

    results = run_cases(Context(0, 2, torch.device("cpu")), [case("a"), case("b", fail=True), case("c")])
    assert ran == ["a", "b"]
    assert results["a"] is None and "AssertionError: b failed" in results["b"]
    assert results["c"] == "not run: case b failed on rank 0 before it"
