"""float64 group_norm dx at tiny groups (1, 8) with 2 groups and SiLU, every float64 path: the worst
relative error against the float64 reference over many draws, beside that draw's conditioning (the norm
of dx's terms before they cancel, tests/test_group_norm.py's dx_term_scale, over the norm of dx).

    python -m bench.lab.probe_gn_float64 [device] [draws]
"""

from __future__ import annotations

import sys

import torch

from tests.test_group_norm import FLOAT64_PATHS, dx_term_scale, reference_grads, run_plans, small_plan


def main() -> None:
    dev = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
    draws = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    torch.manual_seed(0)
    worst: dict[str, tuple] = {}
    for i in range(draws):
        x = torch.randn(1, 8, dtype=torch.float64, device=dev)
        w = torch.randn(8, dtype=torch.float32, device=dev)
        dy = torch.randn(1, 8, dtype=torch.float64, device=dev)
        _, g = reference_grads(x, 2, w, None, dy, 1e-5, "silu")
        ref = g["x"]
        cond = (dx_term_scale(x, 2, w, dy, 1e-5, activation="silu").norm() / ref.norm()).item()
        for path in FLOAT64_PATHS:
            _, (dx, _, _) = run_plans(x, 2, w, None, dy, 1e-5, lambda pb, p=path: small_plan(pb, p, 8, 1), "silu")
            rel = ((dx.double() - ref).norm() / ref.norm()).item()
            if rel > worst.get(path, (0.0,))[0]:
                worst[path] = (rel, cond, i)
    for path, (rel, cond, i) in worst.items():
        print(
            f"{dev} {path}: worst relative error {rel:.3e} at draw {i}, conditioning {cond:.3e}, "
            f"error / (conditioning * 2^-53) {rel / (cond * 2**-53):.1f}"
        )


if __name__ == "__main__":
    main()
