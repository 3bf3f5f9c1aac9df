"""Bytes live in PyTorch's CPU allocator over a forward and a backward, from the profiler's
allocation records (every allocation and free, in order; CPU backward runs in the calling thread):
what a technique's memory claim is measured with."""
import gc

import pytest
import torch

_MARK = (1 << 20) + 4096  # an allocation of this size marks a point in the record


def _records(fn):
    enable = getattr(torch.autograd, "_enable_profiler_legacy", None)
    disable = getattr(torch.autograd, "_disable_profiler_legacy", None)
    legacy = getattr(getattr(torch.autograd, "profiler_legacy", None), "profile", None)
    if enable is None or disable is None or legacy is None:
        pytest.skip("this PyTorch has no legacy profiler records to measure allocations with")
    try:
        enable(legacy(profile_memory=True).config())
    except (TypeError, RuntimeError) as e:  # a PyTorch whose legacy profiler takes another config
        pytest.skip(f"this PyTorch's legacy profiler does not start here: {e}")
    try:
        fn()
    finally:
        records = disable()
    try:
        events = sorted((r.start_us(), i, r.cpu_memory_usage()) for thread in records for i, r in enumerate(thread)
                        if r.kind() == "memory_alloc")
    except AttributeError as e:
        pytest.skip(f"this PyTorch's profiler records have another form: {e}")
    return [b for _, _, b in events]


def _mark():
    torch.empty(_MARK, dtype=torch.uint8)


def forward_backward_bytes(forward, backward):
    """(at the forward/backward boundary, peak during backward), each relative to just before
    forward: forward() returns what backward(out) consumes."""
    def run():
        _mark()
        out = forward()
        _mark()
        backward(out)
    # Tensors of earlier tests left in reference cycles must not be freed inside the record: their
    # frees would count against this forward.
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        sizes = _records(run)
    finally:
        if was_enabled:
            gc.enable()
    marks = [i for i, b in enumerate(sizes) if b == _MARK]
    live, trace = 0, []
    for b in sizes:
        live += b
        trace.append(live)
    start = trace[marks[0]] - _MARK
    boundary = trace[marks[1]] - _MARK - start
    return boundary, max(trace[marks[1] + 2:]) - start
