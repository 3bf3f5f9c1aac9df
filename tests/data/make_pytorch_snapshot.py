#!/usr/bin/env python3
"""Writes the PyTorch-format memory snapshots tests/tools_inspect_pytorch_test.cpp reads: the dict
torch.cuda.memory._snapshot() returns (built by hand: no GPU needed), pickled as
torch.cuda.memory._dump_snapshot does (pickle.dump, default protocol) and at protocol 2, and as
JSON. Frames lists are shared between a block and its trace entries, as PyTorch's are, so the
pickles use the memo. Also, each as _dump_snapshot writes it:
  pytorch_oom.pickle        an OOM entry (device_free in place of addr, as Module.cpp writes it)
  pytorch_streams.pickle    a block pending free on another stream (free_requested, no
                            free_completed yet), requested sizes that are not multiples of 512
  pytorch_stacks_all.pickle stacks="all": C++ frames (unwinder, dispatcher, interpreter) first

    python3 tests/data/make_pytorch_snapshot.py tests/data
"""
import json
import os
import pickle
import sys

MiB = 1 << 20


def frames(name, line):
    return [{"filename": "/work/train.py", "line": line, "name": name},
            {"filename": "/usr/lib/python3/torch/nn/modules/module.py", "line": 1501, "name": "_call_impl"}]


def snapshot():
    base0, base1 = 0x7F4A00000000, 0x7F4A02000000
    weights, act, kv = frames("init_weights", 12), frames("forward", 40), frames("attention", 77)
    seg0 = {"device": 0, "address": base0, "total_size": 20 * MiB, "allocated_size": 16 * MiB,
            "active_size": 16 * MiB, "requested_size": 16 * MiB - 100, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": weights,
            "blocks": [
                {"address": base0, "size": 8 * MiB, "requested_size": 8 * MiB - 100, "state": "active_allocated",
                 "frames": weights},
                {"address": base0 + 8 * MiB, "size": 8 * MiB, "requested_size": 8 * MiB,
                 "state": "active_allocated", "frames": kv},
                {"address": base0 + 16 * MiB, "size": 4 * MiB, "requested_size": 4 * MiB, "state": "inactive",
                 "frames": []}]}
    seg1 = {"device": 0, "address": base1, "total_size": 2 * MiB, "allocated_size": 0, "active_size": 512,
            "requested_size": 0, "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": act,
            "blocks": [
                {"address": base1, "size": 512, "requested_size": 500, "state": "active_pending_free",
                 "frames": act},
                {"address": base1 + 512, "size": 2 * MiB - 512, "requested_size": 0, "state": "inactive",
                 "frames": []}]}
    t = 1_700_000_000_000_000
    trace = [
        {"action": "segment_alloc", "addr": base0, "size": 20 * MiB, "stream": 0, "time_us": t, "frames": weights},
        {"action": "alloc", "addr": base0, "size": 8 * MiB, "stream": 0, "time_us": t + 10, "frames": weights},
        {"action": "alloc", "addr": base0 + 8 * MiB, "size": 12 * MiB, "stream": 0, "time_us": t + 20,
         "frames": act},
        {"action": "free_requested", "addr": base0 + 8 * MiB, "size": 12 * MiB, "stream": 0, "time_us": t + 30,
         "frames": act},
        {"action": "free_completed", "addr": base0 + 8 * MiB, "size": 12 * MiB, "stream": 0, "time_us": t + 31,
         "frames": act},
        {"action": "alloc", "addr": base0 + 8 * MiB, "size": 8 * MiB, "stream": 0, "time_us": t + 40,
         "frames": kv},
        {"action": "segment_alloc", "addr": base1, "size": 2 * MiB, "stream": 0, "time_us": t + 50, "frames": act},
        {"action": "alloc", "addr": base1, "size": 512, "stream": 0, "time_us": t + 60, "frames": act},
        {"action": "free_requested", "addr": base1, "size": 512, "stream": 0, "time_us": t + 70, "frames": act},
        {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": t + 80, "frames": []},
    ]
    return {"segments": [seg0, seg1], "device_traces": [trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1}}


def snapshot_oom():
    base = 0x7F5000000000
    fwd = frames("forward", 40)
    seg = {"device": 0, "address": base, "total_size": 20 * MiB, "allocated_size": 12 * MiB,
           "active_size": 12 * MiB, "requested_size": 12 * MiB, "stream": 0, "segment_type": "large",
           "segment_pool_id": (0, 0), "is_expandable": False, "frames": fwd,
           "blocks": [{"address": base, "size": 12 * MiB, "requested_size": 12 * MiB, "state": "active_allocated",
                       "frames": fwd},
                      {"address": base + 12 * MiB, "size": 8 * MiB, "requested_size": 0, "state": "inactive",
                       "frames": []}]}
    t = 1_700_000_000_000_000
    trace = [
        {"action": "segment_alloc", "addr": base, "size": 20 * MiB, "stream": 0, "time_us": t, "frames": fwd},
        {"action": "alloc", "addr": base, "size": 12 * MiB, "stream": 0, "time_us": t + 1, "frames": fwd},
        # CUDACachingAllocator.cpp: record_trace(OOM, device_free, params.size(), ...); Module.cpp
        # names the address slot device_free for an OOM.
        {"action": "oom", "device_free": 123456789, "size": 16 * MiB, "stream": 0, "time_us": t + 2,
         "frames": fwd},
    ]
    return {"segments": [seg], "device_traces": [trace]}


def snapshot_streams():
    # A (4 MiB + 100 requested, a 4 MiB + 512 block) used on a second stream: freed but pending;
    # B freed and completed; C freed later; D reuses B's place. Block sizes are the requests
    # rounded to 512 (round_size). Allocated (PyTorch's allocated_bytes) drops at free_requested.
    base, s1 = 0x7F6000000000, 94558377318400
    comm, fwd, bwd = frames("all_reduce", 33), frames("forward", 40), frames("backward", 90)
    a, b, c, d = base, base + 4 * MiB + 512, base + 10 * MiB, base + 4 * MiB + 512
    seg = {"device": 0, "address": base, "total_size": 20 * MiB, "allocated_size": 2 * MiB,
           "active_size": 6 * MiB + 512, "requested_size": 6 * MiB + 100, "stream": s1, "segment_type": "large",
           "segment_pool_id": (0, 0), "is_expandable": False, "frames": comm,
           "blocks": [{"address": a, "size": 4 * MiB + 512, "requested_size": 4 * MiB + 100,
                       "state": "active_pending_free", "frames": comm},
                      {"address": d, "size": 2 * MiB, "requested_size": 2 * MiB - 3, "state": "active_allocated",
                       "frames": fwd},
                      {"address": d + 2 * MiB, "size": 14 * MiB - 512, "requested_size": 0, "state": "inactive",
                       "frames": []}]}
    t = 1_700_000_000_000_000
    e = lambda action, addr, size, dt, fr: {"action": action, "addr": addr, "size": size, "stream": s1,
                                            "time_us": t + dt, "frames": fr}
    trace = [e("segment_alloc", base, 20 * MiB, 0, comm),
             e("alloc", a, 4 * MiB + 100, 1, comm),
             e("alloc", b, 6 * MiB - 1000, 2, bwd),
             e("alloc", c, 3 * MiB, 3, fwd),
             e("free_requested", a, 4 * MiB + 100, 4, comm),
             e("free_requested", b, 6 * MiB - 1000, 5, bwd),
             e("free_completed", b, 6 * MiB - 1000, 6, bwd),
             e("alloc", d, 2 * MiB - 3, 7, fwd),
             e("free_requested", c, 3 * MiB, 8, fwd),
             e("free_completed", c, 3 * MiB, 9, fwd)]
    return {"segments": [seg], "device_traces": [trace]}


def snapshot_stacks_all():
    # torch.cuda.memory._record_memory_history(stacks="all"): C++ frames, innermost first, with
    # the Python frames interleaved. One list object per distinct stack, shared (the memo).
    def f(name, filename, line):
        return {"name": name, "filename": filename, "line": line}
    unwind = f("torch::unwind::unwind()", "/pytorch/torch/csrc/profiler/unwind/unwind.cpp", 322)
    gather = f("torch::CapturedTraceback::gather(bool, bool, bool)",
               "/pytorch/torch/csrc/profiler/combined_traceback.cpp", 79)
    boxing = f("c10::impl::BoxedKernelWrapper<>::call", "/pytorch/aten/src/ATen/core/boxing/impl/boxing.h", 41)
    empty = f("at::native::empty_cuda", "/pytorch/aten/src/ATen/native/cuda/EmptyTensor.cpp", 23)
    ceval = f("_PyEval_EvalFrameDefault", "/usr/local/src/conda/python-3.10/Python/ceval.c", 4181)
    python_stack = [unwind, gather, boxing, empty, f("forward", "/work/model.py", 40), ceval,
                    f("train", "/work/train.py", 9)]
    cpp_stack = [unwind, gather, boxing, empty, ceval]
    filtered_stack = [unwind, ceval]
    base = 0x7F7000000000
    blocks, trace, t = [], [], 1_700_000_000_000_000
    for i, stack in enumerate([python_stack, cpp_stack, filtered_stack]):
        blocks.append({"address": base + i * MiB, "size": MiB, "requested_size": MiB, "state": "active_allocated",
                       "frames": stack})
        trace.append({"action": "alloc", "addr": base + i * MiB, "size": MiB, "stream": 0, "time_us": t + i,
                      "frames": stack})
    seg = {"device": 0, "address": base, "total_size": 4 * MiB, "allocated_size": 3 * MiB, "active_size": 3 * MiB,
           "requested_size": 3 * MiB, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
           "is_expandable": False, "frames": python_stack,
           "blocks": blocks + [{"address": base + 3 * MiB, "size": MiB, "requested_size": 0, "state": "inactive",
                                "frames": []}]}
    trace.insert(0, {"action": "segment_alloc", "addr": base, "size": 4 * MiB, "stream": 0, "time_us": t - 1,
                     "frames": python_stack})
    return {"segments": [seg], "device_traces": [trace]}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    s = snapshot()
    with open(os.path.join(out, "pytorch_snapshot.pickle"), "wb") as f:
        pickle.dump(s, f)  # what _dump_snapshot does
    with open(os.path.join(out, "pytorch_snapshot_p2.pickle"), "wb") as f:
        pickle.dump(s, f, protocol=2)
    with open(os.path.join(out, "pytorch_snapshot.json"), "w") as f:
        json.dump(s, f, indent=1)
    for name, make in (("pytorch_oom", snapshot_oom), ("pytorch_streams", snapshot_streams),
                       ("pytorch_stacks_all", snapshot_stacks_all)):
        with open(os.path.join(out, name + ".pickle"), "wb") as f:
            pickle.dump(make(), f)


if __name__ == "__main__":
    main()
