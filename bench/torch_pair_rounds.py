"""The allocation pair through PyTorch alone (section 1 of torch_allocator_bench.py, its functions):
PyTorch's own allocator against stowage through the shim, in fresh processes taking turns, the
median over ROUNDS (default 3) of each process's median of 7 x 20,000 pairs. For a short device
call; run from the repository root with STOWAGE_LIBRARY and PYTHONPATH=python set:
    python3 bench/torch_pair_rounds.py"""
import json, os, subprocess, sys
ROUNDS = int(os.environ.get("ROUNDS", "3"))
CODE = ("import sys,json; sys.path.insert(0,'bench'); import torch_allocator_bench as b; b.enable(sys.argv[1]); "
        "print('RESULT '+json.dumps(b.pair_times()))")
res = {m: [] for m in ("torch", "stowage_shim")}
for r in range(ROUNDS):
    for m in res:
        out = subprocess.run([sys.executable, "-c", CODE, m], capture_output=True, text=True, timeout=240)
        lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
        if out.returncode or not lines:
            print(m, "failed", out.returncode, out.stdout[-2000:], out.stderr[-4000:], flush=True)
            sys.exit(1)
        res[m].append({int(k): v for k, v in json.loads(lines[-1][7:]).items()})
        print(r, m, res[m][-1], flush=True)
import torch
print(f"GPU: {torch.cuda.get_device_name(0)}; PyTorch {torch.__version__}; median over {ROUNDS} interleaved processes")
print("| size | PyTorch ns/pair | shim ns/pair | shim / PyTorch |")
print("|---:|---:|---:|---:|")
for size in res["torch"][0]:
    t = sorted(x[size] for x in res["torch"])[ROUNDS // 2]
    s = sorted(x[size] for x in res["stowage_shim"])[ROUNDS // 2]
    print(f"| {size} | {t:.0f} | {s:.0f} | {s / t:.2f}x |", flush=True)
