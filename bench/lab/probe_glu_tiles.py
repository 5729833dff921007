"""swiglu's and geglu's tile on the GPU: forward and backward time of the
shipped plan against other tile sizes and warp counts, and torch.compile of
the same elementwise formula, at the op table's large rows (T = 16384,
Llama-3-8B's F = 14336 and Gemma-7B's 24576, bf16, contiguous gate and up).

    python -m bench.lab.probe_glu_tiles [--out probe_glu_tiles.md]

At these sizes the op moves 3 (forward) or 5 (backward) bytes per element
pair at the HBM's rate, and the op table (v25) had every large row within
0.1-0.7% of torch.compile's time, a tie at the memory floor.  Candidates,
through ``launch.forward`` / ``launch.backward`` with a hand-built Plan (one
program per tile of a single row of every element, as contiguous inputs
run):

* ``plan``: what ``plan.cuda`` ships (CUDA_BLOCK elements, CUDA_WARPS);
* ``tile/B/wW``: B elements a program, W warps;
* ``compile``: torch.compile of the formula (forward; the backward's
  dgate and dup from dy, gate and up), Inductor's own pointwise kernel.

Time: median of CUDA-graph replays (GPU time only); TB/s: the minimal bytes
(bench/bytes.py's) over that time.  Reading the table: CUDA_BLOCK and
CUDA_WARPS are the tile and warps of the fastest candidate in both
directions, if it beats compile's.
"""

from __future__ import annotations

import torch

from bench.lab.probe_group_norm import candidate_row, run_table_probe

ROWS = 16384
WIDTHS = (14336, 24576)
TILES = ((1024, 4), (2048, 8), (4096, 4), (4096, 8), (8192, 8), (8192, 16))
ACTIVATIONS = {"swiglu": "silu", "geglu": "gelu_tanh"}
# Largest error relative to max |reference| a bf16 output may have (its rounding, a few ulps).
ERROR_BOUND = 2e-2


def _plans(numel: int):
    from csrc_free_ops.glu import plan
    from csrc_free_ops.glu.plan import Plan
    from csrc_free_ops.host_math import cdiv

    yield "plan", plan.cuda(1, numel)
    for block, warps in TILES:
        yield f"tile/{block}/w{warps}", Plan(1, block, cdiv(numel, block), warps)


def _act(g: torch.Tensor, activation: str) -> torch.Tensor:
    return torch.nn.functional.silu(g) if activation == "silu" else torch.nn.functional.gelu(g, approximate="tanh")


def _formula(activation: str):
    """(forward, backward) of act(gate) * up in float32, cast back: what Inductor fuses."""

    def forward(gate, up):
        return (_act(gate.float(), activation) * up.float()).to(gate.dtype)

    def backward(dy, gate, up):
        g = gate.float().requires_grad_(True)
        with torch.enable_grad():
            a = _act(g, activation)
        (da,) = torch.autograd.grad(a, g, torch.ones_like(a))
        dy32 = dy.float()
        return (dy32 * up.float() * da).to(gate.dtype), (dy32 * a.detach()).to(up.dtype)

    return forward, backward


def _act_and_grad(g: torch.Tensor, activation: str) -> tuple[torch.Tensor, torch.Tensor]:
    """act(g) and its derivative, written out (what compile fuses into one kernel)."""
    if activation == "silu":
        s = torch.sigmoid(g)
        return g * s, s * (1 + g * (1 - s))
    c = 0.7978845608028654  # sqrt(2 / pi)
    t = torch.tanh(c * (g + 0.044715 * g * g * g))
    return 0.5 * g * (1 + t), 0.5 * (1 + t) + 0.5 * g * (1 - t * t) * c * (1 + 3 * 0.044715 * g * g)


def _compiled(activation: str):
    """torch.compile of the forward and of the backward's formula."""

    def forward(gate, up):
        return (_act_and_grad(gate.float(), activation)[0] * up.float()).to(gate.dtype)

    def backward(dy, gate, up):
        a, da = _act_and_grad(gate.float(), activation)
        dy32 = dy.float()
        return (dy32 * up.float() * da).to(gate.dtype), (dy32 * a).to(up.dtype)

    return torch.compile(forward, fullgraph=True), torch.compile(backward, fullgraph=True)


def _candidates(name: str, gate, up, dy, compile_too: bool = True):
    """(label, direction, fn) of every candidate, both directions."""
    from csrc_free_ops.glu import launch

    activation = ACTIVATIONS[name]
    for label, p in _plans(gate.numel()):
        yield label, "fwd", lambda p=p: (launch.forward(gate, up, activation, p),)
        yield label, "bwd", lambda p=p: launch.backward(dy, gate, up, activation, p)
    if compile_too:
        fwd, bwd = _compiled(activation)
        yield "compile", "fwd", lambda: (fwd(gate, up),)
        yield "compile", "bwd", lambda: bwd(dy, gate, up)


def _references(name: str, gate, up, dy):
    forward, backward = _formula(ACTIVATIONS[name])
    g64, u64, dy64 = gate.double(), up.double(), dy.double()
    return {"fwd": (forward(g64, u64),), "bwd": backward(dy64, g64, u64)}


def probe(name: str, n_cols: int, rep: int) -> list[str]:
    g = torch.Generator(device="cuda").manual_seed(0)
    gate, up, dy = (torch.randn(ROWS, n_cols, device="cuda", generator=g).bfloat16() for _ in range(3))
    refs = _references(name, gate, up, dy)
    moved = {"fwd": 3 * gate.numel() * gate.element_size(), "bwd": 5 * gate.numel() * gate.element_size()}
    return [
        candidate_row(
            f"{name} | {n_cols} | {direction} | {label}", fn, refs[direction], moved[direction], rep, ERROR_BOUND
        )  # fmt: skip
        for label, direction, fn in _candidates(name, gate, up, dy)
    ]


def _table(rep: int) -> tuple[list[str], list[str]]:
    head = [f"# swiglu / geglu tiles: {torch.cuda.get_device_name()}, T={ROWS}, bf16, contiguous", "",
            "| op | F | dir | candidate | ok | graph us | TB/s |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    print("\n".join(head), flush=True)
    return head, [line for name in ACTIVATIONS for n_cols in WIDTHS for line in probe(name, n_cols, rep)]


def main(argv: list[str] | None = None) -> int:
    return run_table_probe("bench.lab.probe_glu_tiles", __doc__, "probe_glu_tiles.md", 50, argv, _table)


if __name__ == "__main__":
    raise SystemExit(main())
