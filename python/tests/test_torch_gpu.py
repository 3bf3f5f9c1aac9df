"""stowage as PyTorch's CUDA allocator on a GPU. Each test runs in its own interpreter: the
allocator is chosen before the first CUDA allocation of a process. Skipped without a GPU."""
import json

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ENABLE = "import json, torch, stowage, stowage.torch as st\nassert st.enable(shim='required') == 'shim'\n"


def run(python, code, **env):
    r = python(code, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_a_block_recorded_on_a_side_stream_waits_for_that_stream(python):
    # The side stream writes a pattern after a long kernel; the block is freed on the main stream
    # and allocated again at once. Its new owner must never see the side stream's write.
    out = run(python, ENABLE + """
side = torch.cuda.Stream()
n = 1 << 20
x = torch.empty(n, device='cuda')
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    torch.cuda._sleep(500_000_000)
    x.fill_(7.0)
x.record_stream(side)
address = x.data_ptr()
del x
y = torch.zeros(n, device='cuda')
torch.cuda.synchronize()
print(json.dumps({'reused': y.data_ptr() == address, 'clean': bool((y == 0).all().item())}))
""")
    result = json.loads(out.strip().splitlines()[-1])
    assert result["clean"], result


def test_record_stream_on_an_empty_tensor_or_foreign_memory_records_nothing(python):
    # PyTorch's own allocator returns at once for an empty tensor (NULL) and for memory it did not
    # give (here cuMemAlloc's, seen through __cuda_array_interface__); NCCL records every input and
    # output. A block of stowage's is recorded.
    out = run(python, ENABLE + """
import ctypes
side = torch.cuda.Stream()
torch.empty(0, device='cuda').record_stream(side)
torch.cuda.init()
cuda = ctypes.CDLL('libcuda.so.1')
ptr = ctypes.c_uint64()
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(16)) == 0

class Foreign:
    __cuda_array_interface__ = {'shape': (4,), 'typestr': '<f4', 'data': (ptr.value, False), 'version': 2}

foreign = torch.as_tensor(Foreign(), device='cuda')
assert foreign.data_ptr() == ptr.value
foreign.record_stream(side)
lib = stowage._lib.library()
ours = torch.empty(1 << 20, device='cuda')
ours.record_stream(side)
print(json.dumps({'ours': lib.stowage_block_device(ours.data_ptr()), 'foreign': lib.stowage_block_device(ptr.value),
                  'null': lib.stowage_block_device(None)}))
""")
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"ours": 0, "foreign": -1, "null": -1}


def test_a_tensor_is_freed_straight_into_stowage(python):
    # The shim's deleter for device 0, not the pluggable allocator's map: the bytes come back
    # to stowage's statistics when the tensor goes; raw_alloc'd bytes when raw_delete frees them.
    out = run(python, ENABLE + """
assert st.build_shim().frees_directly(0)
before = st.memory_allocated()
x = torch.empty(3 << 20, dtype=torch.uint8, device='cuda')
held = st.memory_allocated() - before
del x
after = st.memory_allocated() - before
# raw_alloc / raw_delete (no tensor): freed on the device that owns the block.
import warnings
with warnings.catch_warnings():
    warnings.simplefilter('error')
    p = torch.cuda.caching_allocator_alloc(5 << 20)
    raw = st.memory_allocated() - before
    torch.cuda.caching_allocator_delete(p)
print(json.dumps({'held': held, 'after': after, 'raw': raw, 'raw_after': st.memory_allocated() - before}))
""")
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"held": 3 << 20, "after": 0, "raw": 5 << 20, "raw_after": 0}, result


def test_out_of_memory_is_catchable_and_training_goes_on(python):
    out = run(python, ENABLE + """
held = []
try:
    while True:
        held.append(torch.empty(1 << 30, dtype=torch.uint8, device='cuda'))
except torch.cuda.OutOfMemoryError as e:
    message = str(e)
assert 'out of memory' in message and 'capacity' in message, message
count = len(held)
del held
torch.cuda.empty_cache()
assert st.memory_allocated() == 0
w = torch.randn(1024, 1024, device='cuda', requires_grad=True)
loss = (w @ w).square().mean()
loss.backward()
print(count, st.memory_reserved() < (4 << 30))
""")
    count, small = out.split()
    assert int(count) > 0 and small == "True"


TRAIN = """
import json, os, torch
allocator = os.environ['TRAIN_ALLOCATOR']
if allocator == 'stowage':
    import stowage.torch as st
    st.enable(shim='required')
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.0, batch_first=True)
model = torch.nn.TransformerEncoder(layer, 4).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
losses = []
for step, seq in enumerate([128, 512, 256, 1024, 64, 768, 384, 1024, 192, 512]):
    g = torch.Generator(device='cuda').manual_seed(step)
    x = torch.randn(8, seq, 512, device='cuda', generator=g)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
peak = st.max_memory_reserved() if allocator == 'stowage' else torch.cuda.max_memory_reserved()
print(json.dumps({'losses': losses, 'peak_reserved': peak}))
"""


def test_a_transformer_trains_with_the_same_losses_in_no_more_memory(python):
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    theirs = json.loads(run(python, TRAIN, TRAIN_ALLOCATOR="pytorch", **env).strip().splitlines()[-1])
    ours = json.loads(run(python, TRAIN, TRAIN_ALLOCATOR="stowage", **env).strip().splitlines()[-1])
    assert ours["losses"] == theirs["losses"]
    assert ours["peak_reserved"] <= theirs["peak_reserved"], (ours["peak_reserved"], theirs["peak_reserved"])
