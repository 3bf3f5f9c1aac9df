"""The small model, data and loop the optimizer tests (test_torch_optim.py, test_torch_offload.py)
train: a bf16 MLP whose losses, masters and states are compared bit for bit."""
import torch


def make_model(seed=0, device="cpu"):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(), torch.nn.Linear(40, 7)).to(device)


def batches(n, seed=1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 24, generator=g).to(device), torch.randint(0, 7, (16,), generator=g).to(device))
            for _ in range(n)]


def train(model, opt, data, poison=(), missing=None):
    """The losses of one pass over `data`; the steps in `poison` get a NaN gradient, and in step k
    the parameters at the indices missing[k] get none (a skipped block, an unrouted expert)."""
    losses = []
    for k, (x, y) in enumerate(data):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x.to(torch.bfloat16)).float(), y)
        loss.backward()
        for i, p in enumerate(model.parameters()):
            if i in (missing or {}).get(k, ()):
                p.grad = None
        if k in poison:
            next(model.parameters()).grad.view(-1)[3] = float("nan")
        opt.step()
        losses.append(loss.item())
    return losses


def bits(t):
    """The tensor's bits as integers on the CPU (NaN payloads and -0 compare exactly)."""
    t = t.detach().cpu().contiguous()
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)
