"""float64 group_norm dx at tiny groups (1, 8) with 2 groups and SiLU, every path: the worst relative
error against the float64 reference over many draws, beside that draw's conditioning (the norm of dx's
terms before they cancel, rstd * (|dz w| + |mean(dz w)| + |xhat mean(dz w xhat)|), over the norm of dx).

    python -m bench.lab.probe_gn_float64 [device] [draws]
"""

from __future__ import annotations

import sys

import torch

from csrc_free_ops.group_norm import reference
from tests.test_group_norm import reference_grads, run_plans, small_plan

PATHS = ("whole", "looped", "split", "one_pass")


def conditioning(x, w, dy, groups, eps):
    xhat, rstd = reference._normalized(x.double(), groups, eps)
    xhat = xhat.reshape(x.shape)
    z = xhat * w.double()[None, :]
    s = torch.sigmoid(z)
    a = dy.double() * s * (1 + z * (1 - s)) * w.double()[None, :]
    n, c = x.shape
    ag, xg = a.reshape(n, groups, -1), xhat.reshape(n, groups, -1)
    terms = ag.abs() + ag.mean(-1, keepdim=True).abs() + (xg * (ag * xg).mean(-1, keepdim=True)).abs()
    terms = terms * rstd.reshape(n, groups, 1)
    return terms.reshape(n, c)


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
        cond = (conditioning(x, w, dy, 2, 1e-5).norm() / ref.norm()).item()
        for path in PATHS:
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
