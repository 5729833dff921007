"""The GroupNorm launch sequence, one for every backend, taking a Plan as
data, and the entry of each dispatch key (registrations/group_norm.py binds
them):

* ``cuda_forward`` / ``cuda_backward``: ``plan.cuda`` for the tensors' GPU
  (also the CPU interpreter path, with ``device.CPU_PROGRAMS`` as SMs and
  no one-pass plans);
* ``npu_forward`` / ``npu_backward``: ``plan.npu`` for the Ascend profile;
* ``prepare_*``: each entry's prepared form (registrations/eager.py): the
  same steps with the plan, launchers and scalars fixed for every call with
  the arguments' signature.

The sequence runs a plan's steps in order, each with the direction's one
argument tuple (kernels.py; the activation is a constexpr of the plan's): x
read in place when contiguous or channels-last (layout.py; otherwise copied
to contiguous), grad_out in x's layout, y and dx made in it, all viewed as
(N, C, HW) with the layout's strides, and the workspace and barrier counters
the plan asks for.  The op
is host-bound on small shapes, so a call does little Python: the CUDA entry
finds its plan under a key of plain ints, and each plan's launchers
(``csrc_free_ops.launcher``) are built once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from csrc_free_ops import device
from csrc_free_ops.alloc import empty_like_maker, empty_maker
from csrc_free_ops.group_norm import layout, plan, reference, residency
from csrc_free_ops.group_norm.plan import Plan, Problem
from csrc_free_ops.group_norm.residency import CudaDevice
from csrc_free_ops.launcher import Launcher, placeholder, tracing

# The op's one cache, with one bound on its memory: each call's plan under a key of plain ints
# (``_cuda_plan``, ``_npu_plan``), each plan's launchers, and a one-pass plan's resident grid.
MAX_CACHED = 1024
_CACHE: dict[tuple, Any] = {}


def _cached(key: tuple, build: Callable[[], Any]) -> Any:
    hit = _CACHE.get(key)
    if hit is None:
        if len(_CACHE) >= MAX_CACHED:
            _CACHE.clear()
        hit = _CACHE[key] = build()
    return hit


def _of_plan(key: tuple, p: Plan, build: Callable[[], Any]) -> Any:
    """build() kept for p under ``key`` (which holds id(p)): checked by
    identity, so a plan made at a dropped one's address is not taken for it."""
    hit = _CACHE.get(key)
    if hit is None or hit[0] is not p:
        if len(_CACHE) >= MAX_CACHED:
            _CACHE.clear()
        hit = _CACHE[key] = (p, build())
    return hit[1]


def _launches(p: Plan) -> tuple[tuple[Launcher, int], ...]:
    """(launcher, grid) of each step of p, built once per plan."""
    return _of_plan(("launches", id(p)), p, lambda: tuple(
        (Launcher(s.kernel, **dict(s.constexprs), **dict(s.options)), s.grid) for s in p.steps))  # fmt: skip


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _read(x: torch.Tensor, p: Plan) -> torch.Tensor:
    """x in the layout p was planned for (a channels-last x the planner was
    not told of is copied, never misread)."""
    x, is_channels_last = layout.as_read(x)
    return x if is_channels_last == p.channels_last else layout.like(x, p.channels_last)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _buffers(p: Plan, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The plan's workspace and zeroed barrier counters; x stands in for
    either when the plan needs none."""
    size, dev = p.workspace_size, x.device
    workspace = torch.empty(size, dtype=_compute_dtype(x), device=dev) if size else placeholder(x)
    counters = torch.zeros(p.counters, dtype=torch.int32, device=dev) if p.counters else placeholder(x)
    return workspace, counters


def _param_grads(
    weight: torch.Tensor | None, bias: torch.Tensor | None, c: int, dev: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """dweight / dbias, uninitialized: the reduce writes all C channels of
    each.  Two allocations: outputs sharing storage break the op's schema
    (opcheck: "outputs alias unexpectedly")."""
    return (torch.empty(c, dtype=weight.dtype, device=dev) if weight is not None else None,
            torch.empty(c, dtype=bias.dtype, device=dev) if bias is not None else None)  # fmt: skip


def _sizes(x: torch.Tensor) -> tuple[int, int, int]:
    n, c = x.shape[0], x.shape[1]
    return n, c, x.numel() // (n * c)


def _dims(x: torch.Tensor, p: Plan) -> tuple[int, int, int, int, int]:
    """The kernels' (N, C, HW, stride_c, stride_s) of x, read in p's layout."""
    return (*_sizes(x), *layout.strides(x, p.channels_last))


def forward(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    p: Plan,
) -> torch.Tensor:
    """y (x's shape, dtype and layout: layout.py) by the steps of p."""
    x = _read(x, p)
    y = layout.empty_output(x)
    if x.numel() == 0:
        return y
    w = _contiguous(weight) if weight is not None else placeholder(x)
    b = _contiguous(bias) if bias is not None else placeholder(x)
    args = (x, w, b, y, *_buffers(p, x), *_dims(x, p), num_groups, p.chunk, eps)
    steps = _steps(p, args, x)
    if steps is None:  # a one-pass kernel that would not be resident: the plan's two-walk fallback
        p = p.fallback
        args = (x, w, b, y, *_buffers(p, x), *_dims(x, p), num_groups, p.chunk, eps)
        steps = _launches(p)
    for launcher, grid in steps:
        launcher(grid, *args)
    return y


def backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    p: Plan | None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(dx, dweight or None, dbias or None) by the steps of p (None for an
    empty x); dx in x's dtype and layout, dweight / dbias in their
    parameter's."""
    if p is None:
        return (layout.empty_output(x), torch.zeros_like(weight) if weight is not None else None,
                torch.zeros_like(bias) if bias is not None else None)  # fmt: skip
    x = _read(x, p)
    dy = layout.like(grad_out, p.channels_last)
    dx = layout.empty_output(x)
    dweight, dbias = _param_grads(weight, bias, x.shape[1], x.device)
    w = _contiguous(weight) if weight is not None else placeholder(x)
    b = _contiguous(bias) if bias is not None else placeholder(x)
    dw = placeholder(x) if dweight is None else dweight
    db = placeholder(x) if dbias is None else dbias
    tensors = (dy, x, w, b, dx, dw, db)
    args = (*tensors, *_buffers(p, x), *_dims(x, p), num_groups, p.chunk, eps)
    steps = _steps(p, args, x)
    if steps is None:  # a one-pass kernel that would not be resident: the plan's two-walk fallback
        p = p.fallback
        args = (*tensors, *_buffers(p, x), *_dims(x, p), num_groups, p.chunk, eps)
        steps = _launches(p)
    for launcher, grid in steps:
        launcher(grid, *args)
    return dx, dweight, dbias


# --- one-pass residency (residency.py: why the grid must be resident, and how it is capped)


def _steps(p: Plan, args: tuple, x: torch.Tensor) -> tuple[tuple[Launcher, int], ...] | None:
    """The (launcher, grid) of each step of p for these arguments: a one-pass
    plan's team grid capped at what its compiled kernel keeps resident, or
    None if the plan's fallback must run; worked out once per plan, device
    and argument dtypes."""
    if not p.team_size or x.device.type != "cuda":
        return _launches(p)
    if tracing():  # a traced launch cannot be capped to what stays resident: the two-walk fallback
        return None
    key = ("capped", id(p), x.device, *(a.dtype for a in args if isinstance(a, torch.Tensor)))
    return _of_plan(key, p, lambda: _capped(p, args, x))


def capped_steps(p: Plan) -> list[tuple[tuple[Launcher, int], ...] | None]:
    """What ``_steps`` found for one-pass plan p on each device it ran on (tests and the probe read it)."""
    return [hit[1] for key, hit in _CACHE.items() if key[0] == "capped" and hit[0] is p]


def _capped(p: Plan, args: tuple, x: torch.Tensor) -> tuple[tuple[Launcher, int], ...] | None:
    launches = _launches(p)
    launcher, grid = launches[0]
    compiled = launcher.kernel.warmup(*args, grid=(grid,), **launcher.meta)
    compiled._init_handles()  # loads it: n_regs
    props = torch.cuda.get_device_properties(x.device)
    dev = _cuda_device(x.device, props.multi_processor_count)  # the real SMs, whatever planning was told
    meta = compiled.metadata
    teams = residency.resident_teams(
        dev, meta.num_warps, compiled.n_regs, meta.shared, p.team_size, grid // p.team_size
    )
    if teams == 0 or -(-p.counters // teams) > p.max_rounds:
        return None
    return ((launcher, teams * p.team_size), *launches[1:])


# --- prepared calls: what forward and backward work out from a signature, done once.
# A prepared run keeps no tensor: only sizes, the plan and bound launches.  Plans that need
# barrier counters or a residency cap keep the general sequence with the plan fixed.


def _bindable(p: Plan, x: torch.Tensor, *params: torch.Tensor | None) -> bool:
    """p's steps can be bound once: no counters, no one-pass cap, x read in place, parameters contiguous."""
    if p.counters or p.team_size or x.numel() == 0:
        return False
    if layout.as_read(x)[0] is not x or layout.channels_last(x) != p.channels_last:
        return False
    return all(t is None or t.is_contiguous() for t in params)


def _output_format(x: torch.Tensor) -> torch.memory_format:
    """layout.empty_output's layout for x as an empty_like memory format."""
    return torch.preserve_format if layout.channels_last(x) else torch.contiguous_format


def _in_layout(t: torch.Tensor, is_channels_last: bool) -> bool:
    """t is read in place in that layout (``layout.like`` returns it as is)."""
    return layout.dense_channels_last(t) if is_channels_last else t.is_contiguous()


def _workspace_maker(size: int, dtype: torch.dtype, dev: torch.device) -> Callable | None:
    """A maker of the plan's workspace of ``size`` elements (None where it has none)."""
    return empty_maker((size,), dtype, dev) if size else None


def _bound_steps(p: Plan, x: torch.Tensor, num_groups: int, eps: float) -> tuple:
    scalars = (*_dims(x, p), num_groups, p.chunk, eps)
    return tuple(launcher.bind(grid, scalars) for launcher, grid in _launches(p))


def _prepared_forward(x, num_groups, weight, bias, eps, p: Plan) -> Callable:
    if not _bindable(p, x, weight, bias):
        return lambda x, num_groups, weight, bias, eps, activation="none": forward(x, num_groups, weight, bias, eps, p)
    steps = _bound_steps(p, x, num_groups, eps)
    new_y = empty_like_maker(x, _output_format(x))
    new_ws = _workspace_maker(p.workspace_size, _compute_dtype(x), x.device)

    def run(x, num_groups, weight, bias, eps, activation="none"):
        y = new_y()
        w = x if weight is None else weight  # a parameter the plan's kernels never read
        b = x if bias is None else bias
        ws = x if new_ws is None else new_ws()
        for step in steps:
            step(x, w, b, y, ws, x)
        return y

    return run


def _prepared_backward(grad_out, x, num_groups, weight, bias, eps, p: Plan | None) -> Callable:
    if p is None or not _bindable(p, x, weight, bias) or not _in_layout(grad_out, p.channels_last):
        return lambda grad_out, x, num_groups, weight, bias, eps, activation="none": backward(
            grad_out, x, num_groups, weight, bias, eps, p
        )
    steps = _bound_steps(p, x, num_groups, eps)
    dev, c = x.device, x.shape[1]
    new_dx = empty_like_maker(x, _output_format(x))
    new_dweight = None if weight is None else empty_maker((c,), weight.dtype, dev)
    new_dbias = None if bias is None else empty_maker((c,), bias.dtype, dev)
    new_ws = _workspace_maker(p.workspace_size, _compute_dtype(x), dev)

    def run(grad_out, x, num_groups, weight, bias, eps, activation="none"):
        dx = new_dx()
        dweight = None if new_dweight is None else new_dweight()
        dbias = None if new_dbias is None else new_dbias()
        ws = x if new_ws is None else new_ws()
        tensors = (grad_out, x, x if weight is None else weight, x if bias is None else bias, dx,
                   x if dweight is None else dweight, x if dbias is None else dbias, ws, x)  # fmt: skip
        for step in steps:
            step(*tensors)
        return dx, dweight, dbias

    return run


def prepare_cuda_forward(x, num_groups, weight, bias, eps, activation="none") -> Callable:
    p = None if x.numel() == 0 else _cuda_plan(x, num_groups, weight is not None, bias is not None, False, activation)
    if p is None:
        return None
    return _prepared_forward(x, num_groups, weight, bias, eps, p)


def prepare_cuda_backward(grad_out, x, num_groups, weight, bias, eps, activation="none") -> Callable:
    p = _cuda_plan(x, num_groups, weight is not None, bias is not None, True, activation) if x.numel() else None
    return _prepared_backward(grad_out, x, num_groups, weight, bias, eps, p)


# --- the entries of the dispatch keys


@functools.lru_cache(maxsize=64)
def _cuda_device(dev: torch.device, sms: int) -> CudaDevice:
    """The planning facts of a GPU; CPU tensors (the interpreter) get
    ``sms`` programs' worth and no one-pass plans."""
    if dev.type != "cuda":
        return CudaDevice(sms)
    props = torch.cuda.get_device_properties(dev)
    return CudaDevice(
        sms,
        cooperative=True,
        regs_per_sm=getattr(props, "regs_per_multiprocessor", 65536),
        shared_per_sm=getattr(props, "shared_memory_per_multiprocessor", 233472),
        threads_per_sm=getattr(props, "max_threads_per_multi_processor", 2048),
        ctas_per_sm=32 if props.major >= 8 else 16,
    )


def _cuda_plan(x: torch.Tensor, num_groups: int, has_weight: bool, has_bias: bool, backward: bool,
               activation: str) -> Plan:  # fmt: skip
    dev = x.device
    sms = device.sms_of(x)
    n, c, hw = _sizes(x)
    cl = layout.channels_last(x)
    key = ("cuda", n, c, hw, num_groups, x.element_size(), has_weight, has_bias, backward, activation, cl, dev, sms)
    return _cached(key, lambda: plan.cuda(Problem(n, c, hw, num_groups, x.element_size(), has_weight, has_bias,
                                                  backward, activation, cl), _cuda_device(dev, sms)))  # fmt: skip


def cuda_forward(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    activation: str = "none",
) -> torch.Tensor:
    if x.numel() == 0:
        return layout.empty_output(x)
    return forward(x, num_groups, weight, bias, eps, _cuda_plan(x, num_groups, weight is not None, bias is not None,
                                                                False, activation))  # fmt: skip


def cuda_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    activation: str = "none",
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    p = _cuda_plan(x, num_groups, weight is not None, bias is not None, True, activation) if x.numel() else None
    return backward(grad_out, x, num_groups, weight, bias, eps, p)


def _npu_float64(*tensors: torch.Tensor | None) -> bool:
    """triton-ascend compiles no float64 ("[fp8, fp64] is unsupported on
    Ascend", the Ascend compile check): float64 data or parameters run the
    pure-PyTorch reference on the device instead."""
    return any(t is not None and t.dtype == torch.float64 for t in tensors)


def _npu_plan(x: torch.Tensor, num_groups: int, has_weight: bool, has_bias: bool, backward: bool,
              activation: str) -> Plan:  # fmt: skip
    """A contiguous plan: on the NPU a channels-last x goes through a copy
    (``npu_forward``), since bishengir turns a tile whose last axis is
    strided -- the channels-last [channels, positions] tile -- into gathers
    that overflow the unified buffer (the Ascend compile check)."""
    sizes, ub_bytes, cores = _sizes(x), device.npu_ub_bytes(), device.npu_vector_cores()
    key = ("npu", *sizes, num_groups, x.element_size(), has_weight, has_bias, backward, activation, ub_bytes, cores)
    return _cached(key, lambda: plan.npu(Problem(*sizes, num_groups, x.element_size(), has_weight, has_bias, backward,
                                                 activation), ub_bytes, cores))  # fmt: skip


def npu_forward(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    activation: str = "none",
) -> torch.Tensor:
    if _npu_float64(x, weight, bias):
        return reference.forward(x, num_groups, weight, bias, eps, activation)
    if x.numel() == 0:
        return layout.empty_output(x)
    p = _npu_plan(x, num_groups, weight is not None, bias is not None, False, activation)
    return layout.like(forward(x, num_groups, weight, bias, eps, p), layout.channels_last(x))  # y in x's layout


def npu_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    activation: str = "none",
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    if _npu_float64(grad_out, x, weight, bias):
        return reference.backward(grad_out, x, num_groups, weight, bias, eps, activation)
    p = _npu_plan(x, num_groups, weight is not None, bias is not None, True, activation) if x.numel() else None
    dx, dweight, dbias = backward(grad_out, x, num_groups, weight, bias, eps, p)
    return layout.like(dx, layout.channels_last(x)), dweight, dbias
