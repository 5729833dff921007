"""Checks that need a process group: DTensor op rules, tensor parallelism and
FSDP2.  The same cases run in pytest (tests/test_dtensor.py spawns gloo
processes on CPU) and under torchrun (tests/dist/run.py, nox -s multigpu)."""
