#!/usr/bin/env python3
"""Writes the PyTorch-format memory snapshots tests/tools_inspect_test.cpp reads: the dict
torch.cuda.memory._snapshot() returns (built by hand: no GPU needed), pickled as
torch.cuda.memory._dump_snapshot does (pickle.dump, default protocol) and at protocol 2, and as
JSON. Frames lists are shared between a block and its trace entries, as PyTorch's are, so the
pickles use the memo.

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


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    s = snapshot()
    with open(os.path.join(out, "pytorch_snapshot.pickle"), "wb") as f:
        pickle.dump(s, f)  # what _dump_snapshot does
    with open(os.path.join(out, "pytorch_snapshot_p2.pickle"), "wb") as f:
        pickle.dump(s, f, protocol=2)
    with open(os.path.join(out, "pytorch_snapshot.json"), "w") as f:
        json.dump(s, f, indent=1)


if __name__ == "__main__":
    main()
