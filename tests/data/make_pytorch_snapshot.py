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
  pytorch_stale_requested.pickle  a free block left by a split keeps the requested_size of an
                            earlier, larger allocation (CUDACachingAllocator.cpp: the remainder's
                            `remaining->size -= size`), more than its size
  pytorch_ring_start.pickle the trace (a ring) begins with the free of a 10 MiB block allocated
                            before its window
  pytorch_v20_history.pickle PyTorch 2.0's form (Module.cpp memorySnapshot): blocks without
                            address, requested_size or frames; each allocation's frames and
                            requested size in history[0] (real_size); no time_us in the trace
  pytorch_no_time.pickle    a trace without time_us (PyTorch up to about 2.1)
  pytorch_multi_device.pickle three devices: cuda:0 with one block, cuda:1 with an OOM, cuda:2
                            with a segment only
  pytorch_4gib_segment.pickle a 4 GiB segment next to a 2 MiB one (integers beyond 32 bits)
pytorch_stale_requested, _ring_start, _v20_history, _no_time and _4gib_segment are the
reproducers r1, r2, r5, r6 and r4 of an outside check of `stowage inspect` against PyTorch's
snapshots.

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


def repro_segment(addr, total, blocks, segtype="large", device=0):
    alloc = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    req = sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated")
    return {"device": device, "address": addr, "total_size": total, "allocated_size": alloc, "active_size": alloc,
            "requested_size": req, "stream": 0, "segment_type": segtype, "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": [], "blocks": blocks}


REPRO_FRAMES = [{"name": "forward", "filename": "/work/train.py", "line": 42}]


def repro_block(addr, size, req, state):
    return {"address": addr, "size": size, "requested_size": req, "state": state,
            "frames": list(REPRO_FRAMES) if state != "inactive" else []}


def repro_event(action, addr, size, t=None):
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "frames": list(REPRO_FRAMES)}
    if t is not None:
        e["time_us"] = t
    return e


def snapshot_stale_requested():
    a = 0x7F0000000000
    blocks = [repro_block(a, 19398656, 19398656, "active_allocated"),
              repro_block(a + 19398656, 1572864, 9437184, "inactive")]  # stale: 9 MiB requested once
    trace = [repro_event("segment_alloc", a, 20 * MiB, 1), repro_event("alloc", a, 9 * MiB, 2),
             repro_event("free_requested", a, 9 * MiB, 3), repro_event("free_completed", a, 9 * MiB, 4),
             repro_event("alloc", a, 19398656, 5)]
    return {"segments": [repro_segment(a, 20 * MiB, blocks)], "device_traces": [trace]}


def snapshot_ring_start():
    a = 0x7F0000000000
    blocks = [repro_block(a, MiB, MiB, "active_allocated"), repro_block(a + MiB, 19 * MiB, 0, "inactive")]
    trace = [repro_event("free_requested", a + MiB, 10 * MiB, 10),
             repro_event("free_completed", a + MiB, 10 * MiB, 11)]
    return {"segments": [repro_segment(a, 20 * MiB, blocks)], "device_traces": [trace]}


def snapshot_v20_history():
    a = 0x7F0000000000
    other = [{"name": "backward", "filename": "/work/train.py", "line": 50}]
    blocks = [{"size": 512, "state": "active_allocated",
               "history": [{"addr": a, "real_size": 100, "frames": REPRO_FRAMES},
                           {"addr": a, "real_size": 300, "frames": other}]},
              # freed: its history names what was allocated there before, larger than it now
              {"size": 1024, "state": "inactive", "history": [{"addr": a + 512, "real_size": 4000, "frames": other}]},
              {"size": 2 * MiB - 1536, "state": "inactive"}]
    seg = {"device": 0, "address": a, "total_size": 2 * MiB, "allocated_size": 512, "active_size": 512, "stream": 0,
           "segment_type": "small", "blocks": blocks}
    trace = [{"frames": REPRO_FRAMES, "action": "segment_alloc", "addr": a, "size": 2 * MiB, "stream": 0},
             {"frames": REPRO_FRAMES, "action": "alloc", "addr": a, "size": 100, "stream": 0}]
    return {"segments": [seg], "device_traces": [trace]}


def snapshot_no_time():
    a = 0x7F0000000000
    blocks = [repro_block(a, 1024, 1000, "active_allocated"), repro_block(a + 1024, 2 * MiB - 1024, 0, "inactive")]
    trace = [repro_event("segment_alloc", a, 2 * MiB), repro_event("alloc", a, 100),
             repro_event("free_requested", a, 100), repro_event("free_completed", a, 100),
             repro_event("alloc", a, 1000)]
    return {"segments": [repro_segment(a, 2 * MiB, blocks, "small")], "device_traces": [trace]}


def snapshot_multi_device():
    a0, a1, a2 = 0x7F0000000000, 0x7F1000000000, 0x7F2000000000
    seg0 = repro_segment(a0, 2 * MiB, [repro_block(a0, MiB, MiB, "active_allocated"),
                                       repro_block(a0 + MiB, MiB, 0, "inactive")], device=0)
    seg1 = repro_segment(a1, 20 * MiB, [repro_block(a1, 12 * MiB, 12 * MiB, "active_allocated"),
                                        repro_block(a1 + 12 * MiB, 8 * MiB, 0, "inactive")], device=1)
    seg2 = repro_segment(a2, 2 * MiB, [repro_block(a2, 2 * MiB, 0, "inactive")], device=2)
    trace0 = [repro_event("segment_alloc", a0, 2 * MiB, 1), repro_event("alloc", a0, MiB, 2)]
    oom = {"action": "oom", "device_free": 123456789, "size": 16 * MiB, "stream": 0, "time_us": 5,
           "frames": REPRO_FRAMES}
    trace1 = [repro_event("segment_alloc", a1, 20 * MiB, 3), repro_event("alloc", a1, 12 * MiB, 4), oom]
    return {"segments": [seg0, seg1, seg2], "device_traces": [trace0, trace1, []]}


def snapshot_4gib_segment():
    a, b = 0x7F0000000000, 0x7F1000000000
    small = repro_segment(a, 2 * MiB, [repro_block(a, 512, 100, "active_allocated"),
                                       repro_block(a + 512, 2 * MiB - 512, 0, "inactive")], "small")
    large = repro_segment(b, 4096 * MiB, [repro_block(b, 4096 * MiB, 4096 * MiB, "active_allocated")])
    trace = [repro_event("segment_alloc", a, 2 * MiB, 1), repro_event("alloc", a, 100, 2),
             repro_event("segment_alloc", b, 4096 * MiB, 3), repro_event("alloc", b, 4096 * MiB, 4)]
    return {"segments": [small, large], "device_traces": [trace]}


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
                       ("pytorch_stacks_all", snapshot_stacks_all),
                       ("pytorch_stale_requested", snapshot_stale_requested),
                       ("pytorch_ring_start", snapshot_ring_start), ("pytorch_v20_history", snapshot_v20_history),
                       ("pytorch_no_time", snapshot_no_time), ("pytorch_multi_device", snapshot_multi_device),
                       ("pytorch_4gib_segment", snapshot_4gib_segment)):
        with open(os.path.join(out, name + ".pickle"), "wb") as f:
            pickle.dump(make(), f)


if __name__ == "__main__":
    main()
