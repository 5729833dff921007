"""torchrun entry for the distributed checks (nox -s multigpu):

    torchrun --nproc-per-node 2 -m tests.dist.run            # NCCL, one GPU per rank
    torchrun --nproc-per-node 2 -m tests.dist.run --cpu      # gloo on CPU

Every rank runs every case of tests/dist/suites.multigpu_cases (DTensor ops
and backward ops on batch, heads and sequence shardings against the
single-device result, the tensor-parallel tiny Llama eager and compiled, the
FSDP2 model); rank 0 prints each case's result from every rank and a
closing "N passed, N failed" line; the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="gloo on CPU even where GPUs are present")
    parser.add_argument("--interpret", action="store_true", help="on CPU: the Triton kernels under the interpreter")
    parser.add_argument("-k", default="", help="only the cases whose name contains this")
    args = parser.parse_args()
    if args.cpu:
        os.environ["LIGER_DIST_CPU"] = "1"
    if args.cpu and args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are imported

    import torch
    import torch.distributed as dist

    from tests.dist import suites
    from tests.dist.harness import init, run_cases

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.cpu:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    ctx = init(rank, world_size)
    try:
        cases = [(name, case) for name, case in suites.multigpu_cases(world_size) if args.k in name]
        results = run_cases(ctx, cases)
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, results)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    failed = 0
    print(f"device {ctx.device} x {world_size}, torch {torch.__version__}")
    for name, _ in cases:
        errors = [(r, res[name]) for r, res in enumerate(gathered) if res[name] is not None]
        failed += bool(errors)
        print(f"{'FAIL' if errors else 'PASS'} {name}")
        for r, error in errors:
            print(f"--- rank {r}:\n{error}")
    print(f"{len(cases) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
