"""Optimizers on BF16/FP32 shared storage (docs/pytorch_optimizers.md, "Shared-storage weights").

SharedStorageAdamW(model.parameters(), ...) moves each fp32 parameter into split storage: a bf16
plane, a residual plane and (nearest_even) a tie bitmap, one set per param group. The parameter
itself becomes a bf16 view of the bf16 plane, so the model computes in bf16 with no second copy
of the weights: 4 bytes per parameter instead of 6 (fp32 master + bf16 copy). step() runs
stowage's fused kernels through the C ABI: each element is merged to fp32 in registers, updated
and split again, in the operation order of docs/precision.md.

CPU tensors step on the host; CUDA tensors step on the tensor's device, queued on PyTorch's current
stream (stowage_adam_step_async), when libstowage uses CUDA. state_offload puts m and v (SGD's
momentum buffer) in host memory, mapped or streamed, under a device budget (stowage.torch.offload).
"""
import ctypes
import inspect
import math
import numbers
import warnings
import weakref

import torch

from .. import precision
from ..errors import InvalidArgumentError, UnsupportedError
from ._optim_checks import check_group, decoupled_as_torch_says, decoupled_disagree, param_list, state_value
from ._wrapping import callers_level
from .embedding_renorm import unhook, watch_renorms
from .master_loading import route_loads
from .offload import StateHomes
from .update_overlap import UpdateOverlap

_ALIGN = 64  # elements: every parameter starts a tie byte and a 128-byte line of the bf16 plane


class _Bucket:
    """The planes of one param group, on the group's device, and where each parameter sits."""

    def __init__(self, params, rounding):
        self.rounding = rounding
        self.device = params[0].device if params else torch.device("cpu")
        if any(p.device != self.device for p in params):
            raise InvalidArgumentError("shared-storage optimizers: a param group's parameters must be on one device")
        self.offsets = []
        n = 0
        for p in params:
            self.offsets.append(n)
            n += -(-p.numel() // _ALIGN) * _ALIGN
        self.numel = n
        self.bf16 = torch.zeros(n, dtype=torch.bfloat16, device=self.device)
        self.residual = torch.zeros(n, dtype=torch.int16, device=self.device)
        self.ties = torch.zeros(max(precision.tie_bitmap_bytes(n, rounding), 1), dtype=torch.uint8, device=self.device)
        self._made = {}

    def planes(self, index, numel):
        """The C struct for parameter `index` (numel elements), in the bucket's memory, as the step
        uses it (made once: its addresses are the ones step() checks each parameter's view against)."""
        key = (index, numel)
        made = self._made.get(key)
        if made is None:
            off = self.offsets[index]
            made = self._made[key] = self._planes(self.bf16[off:], self.residual[off:], self.ties[off // 8:], numel)
        return made

    def _planes(self, bf16, residual, ties, numel):
        tie_ptr = ties.data_ptr() if self.rounding == "nearest_even" else 0
        return precision.planes(bf16.data_ptr(), residual.data_ptr(), tie_ptr, numel, self.rounding)

    def _slices(self, index, numel):
        off = self.offsets[index]
        return (self.bf16[off:off + numel], self.residual[off:off + numel],
                self.ties[off // 8:off // 8 + precision.tie_bitmap_bytes(numel, self.rounding)])

    def split(self, index, value):
        """value (an fp32 tensor anywhere) becomes parameter `index`'s master, bit for bit. Device
        planes are split on the host and copied: split and merge run on host memory only. Both
        take the planes' addresses afresh (not the step's cached ones): they stay right where a
        storage moved in place."""
        src = value.detach().to(device="cpu", dtype=torch.float32).contiguous()
        if self.device.type == "cpu":
            precision.split(src.data_ptr(), self._planes(*self._slices(index, src.numel()), src.numel()))
            return
        host = [torch.empty_like(t, device="cpu") for t in self._slices(index, src.numel())]
        precision.split(src.data_ptr(), self._planes(*host, src.numel()))
        for dst, h in zip(self._slices(index, src.numel()), host):
            dst.copy_(h)

    def merge(self, index, shape):
        """Parameter `index`'s master as a new fp32 tensor on the bucket's device."""
        numel = math.prod(shape)
        out = torch.empty(shape, dtype=torch.float32)
        if self.device.type == "cpu":
            precision.merge(self._planes(*self._slices(index, numel), numel), out.data_ptr())
            return out
        host = [t.cpu() for t in self._slices(index, numel)]
        precision.merge(self._planes(*host, numel), out.data_ptr())
        return out.to(self.device)

    def take_bf16_rows(self, index, shape, rows):
        """Rows `rows` (distinct row indices, a long tensor on the bucket's device) of parameter
        `index`, of shape `shape`, take their bf16 values as their master, exactly: residual 0x8000
        and tie bit 0, what split() of those values writes (docs/precision.md), written in place on
        the planes' device instead of merging and splitting the whole parameter. Row by row on 2-D
        views of the planes: its temporaries are O(len(rows)), not O(elements)."""
        off, numel = self.offsets[index], math.prod(shape)
        n_rows = shape[0] if len(shape) else 1
        d = numel // n_rows if n_rows else 0  # elements a row
        self.residual[off:off + numel].view(n_rows, d).index_fill_(0, rows, -0x8000)  # 0x8000 as int16
        if self.rounding != "nearest_even" or not d or not rows.numel():
            return
        # Element e of the parameter has its tie in bit e % 8 of byte e // 8 (off is a multiple of 64).
        ties = self.ties[off // 8:off // 8 + precision.tie_bitmap_bytes(numel, self.rounding)]
        # The bytes wholly inside a row: row r's elements start at bit phase r*d % 8, which repeats
        # every `period` rows, and rows of one phase have their whole bytes `period * d / 8` bytes
        # apart. So for each phase a strided (rows of that phase, whole bytes) view of the bitmap,
        # whose changed rows are zeroed. d % 8 == 0: one phase, the (n_rows, d / 8) view.
        period = 8 // math.gcd(d, 8)
        for phase_row in range(min(period, n_rows)):
            a = phase_row * d
            first = -(-a // 8)  # its first whole byte
            count = (a + d) // 8 - first
            if count <= 0:
                continue
            mine = rows if period == 1 else rows[rows % period == phase_row]
            if mine.numel():
                view = ties.as_strided(((n_rows - phase_row + period - 1) // period, count),
                                       (period * d // 8, 1), ties.storage_offset() + first)
                view.index_fill_(0, mine // period if period > 1 else mine, 0)
        if d % 8 == 0:
            return
        # The bytes a row shares with its neighbours: its first byte from bit a % 8 (when a % 8 > 0)
        # and its last up to bit b % 8 (when b % 8 > 0 and that byte is not the first), a and b its
        # first and one-past-last element. Several changed rows may clear bits of one byte (d < 8, or
        # one row's last byte the next one's first): their bits are disjoint, so the sum of their
        # masks over the byte (a segment sum of the masks sorted by byte: no atomics, deterministic)
        # is their union.
        a = rows * d
        b = a + d
        bit = torch.tensor([1 << k for k in range(9)], dtype=torch.long, device=rows.device)  # 2**k
        head = a % 8 != 0
        head_byte = a[head] // 8
        tail = (b % 8 != 0) & ((b // 8 != a // 8) | ~head)
        byte, order = torch.sort(torch.cat([head_byte, b[tail] // 8]))
        mask = torch.cat([bit[torch.clamp(b[head] - head_byte * 8, max=8)] - bit[a[head] % 8],
                          bit[b[tail] % 8] - 1])[order]
        byte, count = torch.unique_consecutive(byte, return_counts=True)
        total = mask.cumsum(0)[count.cumsum(0) - 1]
        cleared = torch.diff(total, prepend=total.new_zeros(1))
        ties[byte] &= (255 - cleared).to(torch.uint8)

    def view(self, index, shape):
        off = self.offsets[index]
        return self.bf16[off:off + math.prod(shape)].view(shape)

    def nbytes(self):
        return self.bf16.numel() * 2 + self.residual.numel() * 2 + (self.ties.numel() if self.rounding == "nearest_even"
                                                                      else 0)


def is_real(value):
    """A real number as an option takes it: not a bool, a str or a tensor."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _as_kernel_float(value):
    """A hyper-parameter as the kernels take it: a float32 (a one-element real tensor, as torch.optim
    allows for lr, read as its value); None for anything else."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex() and not value.dtype == torch.bool:
        value = value.item()
    if not is_real(value):
        return None
    return ctypes.c_float(value).value if math.isfinite(value) else float(value)


def _finite_non_negative(value):
    v = _as_kernel_float(value)
    return v is not None and math.isfinite(v) and v >= 0


def _below_one(value):
    """A beta as the kernels take it: in [0, 1) after rounding to float32 (1 - 1e-8 rounds to 1)."""
    v = _as_kernel_float(value)
    return v is not None and 0 <= v < 1


def _grad_bits(g):
    return 16 if g.dtype == torch.bfloat16 else 32


class _Batch:
    """One multi-tensor call: a param group's parameters on one device whose state stays put. Its
    StepTensor array is kept from step to step (planes and state do not move); each step sets the
    gradients, and binds a parameter's state addresses and count again only when holds() finds
    other tensors than the ones bound (a first step, a loaded or replaced state). Each parameter's
    state["step"] is then a view of one `counts` tensor, so an applied step counts with one add."""

    def __init__(self, group, device, entries, chunk=0):
        self.group, self.device, self.chunk = group, device, chunk
        self.params = [p for p, _, _ in entries]
        self.tensors = precision.step_tensors([(planes, 0, 32, 0, 0, 0) for _, planes, _ in entries])
        self.counts = torch.zeros(len(entries), dtype=torch.float32)
        self._held = [()] * len(entries)  # per parameter: the state tensors its addresses came from

    def serves(self, entries):
        return len(entries) == len(self.params) and all(p is q for (p, _, _), q in zip(entries, self.params))

    def set_grads(self, entries):
        for t, (_, _, g) in zip(self.tensors, entries):
            t.grad = g.data_ptr()
            t.grad_bits = _grad_bits(g)

    def holds(self, i, state, stepped):
        """Parameter i's state tensors are the objects bound, at the addresses bound."""
        kept = self._held[i]
        return (len(stepped) + 3 == len(kept) and state["step"] is kept[0]
                and all(a is b for a, b in zip(stepped, kept[1:])) and kept[-2:] == _pointers(stepped))

    def bind(self, i, state, stepped):
        """Parameter i's state into the array (stepped: its tensors as the kernel takes them)."""
        t = self.tensors[i]
        t.state0, t.state1 = ptrs = _pointers(stepped)
        self.counts[i] = float(state["step"].item())
        state["step"] = self.counts[i]
        self._held[i] = (state["step"], *stepped, *ptrs)  # also keeps them alive while the array names them

    def load_counts(self):
        """Each tensor's count from `counts`, which each state["step"] views: a count the user set
        in place is the one the kernel uses."""
        for t, count in zip(self.tensors, self.counts.tolist()):
            t.step = int(count)

    def applied(self):
        """The call applied every tensor's step (the C ABI counted them in the array)."""
        self.counts.add_(1.0)


def _finish(homes, overlap, renorms):
    """When an optimizer goes: the updates queued on its state and planes end, and its hooks go."""
    if overlap is not None:
        overlap.synchronize()
        overlap.detach()
    unhook(renorms)
    homes.synchronize()


def _sets_to_none(*args, **kwargs):
    """What torch.optim.Optimizer.zero_grad(*args, **kwargs) does: set the gradients to None (the
    default from PyTorch 2.0) or zero them in place (the default before)."""
    if args:
        return bool(args[0])
    if "set_to_none" in kwargs:
        return bool(kwargs["set_to_none"])
    return inspect.signature(torch.optim.Optimizer.zero_grad).parameters["set_to_none"].default is True


def _joined(arrays):
    """One StepTensor array holding the entries of several (param groups, chunks): one check, one wait."""
    joined = (precision.StepTensor * sum(len(a) for a in arrays))()
    at = ctypes.addressof(joined)
    for a in arrays:
        ctypes.memmove(at, a, ctypes.sizeof(a))
        at += ctypes.sizeof(a)
    return joined


def _pointers(tensors):
    """state0 and state1 of a StepTensor: the tensors' addresses, 0 where there is none."""
    ptrs = [t.data_ptr() for t in tensors]
    return tuple(ptrs + [0] * (2 - len(ptrs)))


def sparse_gradient_error(what, which, outcome):
    """The refusal of a sparse gradient (step()) or of a module that makes them (apply())."""
    return UnsupportedError(
        f"{what}: {which}; sparse gradients are not supported by the shared-storage optimizers: their fused "
        "kernels update every element from a dense gradient (torch.optim.SGD steps sparse gradients, "
        "torch.optim.AdamW refuses them too). Make the embedding with sparse=False (nn.Embedding, "
        f"nn.EmbeddingBag; the default). {outcome}")


class _SharedStorageOptimizer(torch.optim.Optimizer):
    """What AdamW and SGD share: the buckets, the master, the global finite check and clipping."""

    def __init__(self, params, defaults, rounding, max_grad_norm, skip_nonfinite, loss_scale, state_offload,
                 state_device_budget, overlap_update):
        precision.rounding_code(rounding)  # InvalidArgumentError for a misspelt mode
        homes = StateHomes(state_offload, state_device_budget, len(self._state_keys))
        if max_grad_norm is not None and not (is_real(max_grad_norm) and max_grad_norm > 0):
            raise InvalidArgumentError(f"max_grad_norm must be a number > 0 or None (got {max_grad_norm!r})")
        if not (is_real(loss_scale) and loss_scale > 0 and math.isfinite(loss_scale)):
            raise InvalidArgumentError(f"loss_scale must be a finite number > 0 (got {loss_scale!r})")
        if not isinstance(skip_nonfinite, bool):
            raise InvalidArgumentError(f"skip_nonfinite must be True or False (got {skip_nonfinite!r})")
        if not isinstance(overlap_update, bool):
            raise InvalidArgumentError(f"overlap_update must be True or False (got {overlap_update!r})")
        self.rounding = rounding
        self.max_grad_norm = max_grad_norm
        self.skip_nonfinite = skip_nonfinite
        self.loss_scale = loss_scale
        self.last_step_skipped = False
        self._buckets, self._flat, self._where, self._homes = [], [], {}, homes
        where = self._where  # (not self: the model's hooks keep the overlap, which must not keep the optimizer)
        overlap = self._overlap = UpdateOverlap(
            lambda p: where.get(id(p)) is not None and where[id(p)][2] is p) if overlap_update else None
        # Per _flat entry: (address, shape) of the bf16 view the parameter was given, the address the
        # step's planes hold. A storage moved in place (share_memory_()) leaves them pointing at freed
        # memory and a replaced .data (model.float()) leaves them updating what the model no longer reads.
        self._views = []
        # Per _flat entry: the parameter's _version when its master was last written or taken from
        # it. torch counts in-place writes to the parameter (p.zero_(), nn.init, load_state_dict's
        # copy); the kernels write the planes through the C ABI and count nothing.
        self._versions = []
        self._names = {}  # id(param) -> its name in the model, for errors (attach() gives them)
        # Embedding modules with max_norm -> their hooks' handles (attach(); embedding_renorm).
        renorms = self._renorms = weakref.WeakKeyDictionary()
        self._routed = weakref.WeakSet()  # the modules whose load_state_dict writes masters (attach())
        self._models = weakref.WeakSet()  # the models attach() was given
        # Offloaded state sits in stowage's host pool, which hands freed bytes out again at once:
        # before the state goes with the optimizer, the steps queued on it end. (Weak references'
        # callbacks run before the optimizer's attributes are cleared.)
        # At exit nothing allocates any more (and a failed device would only say so again).
        weakref.finalize(self, _finish, homes, overlap, renorms).atexit = False
        self._batch_cache = {}  # (id(group), device, chunk) -> _Batch (chunk 0 without overlap_update)
        self._flags = {}  # device -> the finite check's flag
        # Every group is checked whole before any parameter moves, so a refusal changes nothing.
        if isinstance(params, (set, frozenset)):
            raise InvalidArgumentError("parameters must be an ordered collection (a list, model.parameters()), "
                                       "not a set: the order names them in state_dict()")
        groups = list(params)
        if not groups:
            raise InvalidArgumentError("optimizer got an empty parameter list")  # torch.optim's ValueError
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        held = set()
        for n, g in enumerate(groups):
            if not isinstance(g, dict):
                raise InvalidArgumentError(f"param group {n} is not a dict with 'params'")
            g["params"] = param_list(g["params"])  # as torch.optim sets it in the dict given
            held |= check_group(g, defaults, self._check_hyper_parameters, held,
                                f"{type(self).__name__}(): param group {n}")
        homes.plan_groups([g["params"] for g in groups])
        super().__init__(groups, defaults)

    def add_param_group(self, param_group):
        """torch.optim's: the dict given becomes the group, its defaults filled in. The group is
        checked whole, then its parameters move into planes of their own."""
        if not isinstance(param_group, dict):
            raise InvalidArgumentError("add_param_group(): a param group is a dict with 'params'")
        param_group["params"] = param_list(param_group["params"])
        check_group(param_group, self.defaults, self._check_hyper_parameters, self._where, "add_param_group()")
        placements, books = self._homes.plan(param_group["params"])
        decoupled_as_torch_says(param_group, self.defaults)
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        bucket = _Bucket(group["params"], self.rounding)
        for i, p in enumerate(group["params"]):
            bucket.split(i, p)
            p.data = bucket.view(i, p.shape)  # the model now computes with the bf16 plane itself
            p.grad = None
            self._where[id(p)] = (bucket, i, p, len(self._flat))
            self._flat.append((group, bucket, i, p))
            self._views.append((p.data_ptr(), p.shape))  # (0 for an empty one, which nothing writes)
            self._versions.append(p._version)
        self._buckets.append(bucket)
        self._homes.commit(group["params"], placements, books)
        if self._overlap is not None:
            self._overlap.changed()
            self._batch_cache.clear()  # keyed by the old chunks
        for model in list(self._models):  # a model attached before holds them too (unfreezing a part of it)
            route_loads(model, self, self._routed)
            if self._overlap is not None:
                self._overlap.attach(model)
            watch_renorms(model, self, self._renorms)

    # --- each parameter must stay the bf16 view of its plane ---
    def _which(self, k):
        """_flat entry k's parameter for an error: its name in the model (attach()), else where it sits."""
        group, _, i, p = self._flat[k]
        name = self._names.get(id(p))
        if name:
            return f"parameter '{name}'"
        g = next(n for n, candidate in enumerate(self.param_groups) if candidate is group)
        return f"parameter {i} of param group {g}"

    def _moved(self, k, what):
        """The error for _flat entry k, whose parameter no longer is the view the optimizer gave it."""
        p = self._flat[k][3]
        address, shape = self._views[k]
        which = self._which(k)
        return InvalidArgumentError(
            f"{what}: {which} is no longer the bf16 view of its shared-storage plane (it is {p.dtype} "
            f"{tuple(p.shape)} at {p.data_ptr():#x}; it was torch.bfloat16 {tuple(shape)} at {address:#x}). "
            "Its data was moved or replaced after the optimizer took it: model.float() / .half() / "
            ".to(dtype or device), model.share_memory() or an assignment to .data do that. Nothing was "
            "written. Cast or move the model before the optimizer takes its parameters, and load weights "
            "with model.load_state_dict() under apply() (or opt.attach(model)) or opt.load_master_state_dict()")

    def _is_view(self, k):
        """Whether _flat entry k's parameter is still the bf16 view of its plane the optimizer made."""
        p, (address, shape) = self._flat[k][3], self._views[k]
        return p.data_ptr() == address and p.dtype == torch.bfloat16 and p.shape == shape

    def holds_view(self, param):
        """Whether `param` is one of this optimizer's parameters and still the bf16 view of its plane."""
        found = self._where.get(id(param))
        return found is not None and found[2] is param and self._is_view(found[3])

    def attach(self, model):
        """Ties this optimizer to `model`, the module its parameters came from: errors name each
        parameter by its name in the model, and model.load_state_dict() (or that of any module in
        it or around it) writes each loaded value into the fp32 master, bit for bit, as it would
        become the weight of the fp32 model (docs/pytorch_optimizers.md), and the in-place renorm of an
        nn.Embedding / nn.EmbeddingBag with max_norm counts only the rows it changed as written
        (embedding_renorm). Again on the same model: hooks only what is new. apply() calls it."""
        self._names.update({id(p): name for name, p in model.named_parameters()})
        self._models.add(model)
        route_loads(model, self, self._routed)
        if self._overlap is not None:
            self._overlap.attach(model)
            self._batch_cache.clear()  # keyed by the old chunks
        watch_renorms(model, self, self._renorms)  # after the overlap's hooks: its pre-hook runs first

    def _check_views(self, what):
        """Every parameter still views its plane (before a call writes through the planes)."""
        for k in range(len(self._flat)):
            if not self._is_view(k):
                raise self._moved(k, what)

    # --- the fp32 master ---
    def _find(self, param, what, writes=False):
        found = self._where.get(id(param))
        if found is None or found[2] is not param:
            raise InvalidArgumentError(f"{what}: that tensor is not one of this optimizer's parameters")
        bucket, i, _, k = found
        # A master written into the planes must reach the model: refused once the parameter is not their view.
        if writes and not self._is_view(k):
            raise self._moved(k, what)
        return bucket, i, k

    def _take_writes(self, ks):
        """Each of the _flat entries ks whose parameter was written in place since its master was
        (p.zero_(), p.mul_(mask), nn.init, model.load_state_dict() without attach()) changed only
        its bf16 plane; the old residual would make the master neither value (NaN where the new
        one is 0). Its master becomes the value written, exactly: an fp32 weight would be that value."""
        for k in ks:
            _, bucket, i, p = self._flat[k]
            if p._version != self._versions[k] and self._is_view(k):
                self.wait_for_update()
                bucket.split(i, p.detach())  # a bf16 value's master: residual 0x8000, no tie
                self._versions[k] = p._version

    def _unwritten_version(self, param):
        """param's _version, when it is one of this optimizer's parameters, still its plane's view,
        and no in-place write to it is pending (embedding_renorm's pre-hook); else None."""
        found = self._where.get(id(param))
        if found is None or found[2] is not param or not self._is_view(found[3]):
            return None
        return param._version if param._version == self._versions[found[3]] else None

    def _take_renorm(self, param, version, rows, saved):
        """After a forward that renormalised rows of `param` in place (embedding_renorm): when that
        was the only write since the pre-hook saw `version` (torch counts the renorm as one, whether
        or not a row changed), the rows whose bits changed (of `rows`, None: all, whose bf16 values
        before were `saved`) take their bf16 values as their master; the others keep theirs, bit for
        bit. Any other write with it leaves the count moved: the whole parameter is taken, as ever."""
        found = self._where.get(id(param))
        if found is None or found[2] is not param:
            return
        bucket, i, _, k = found
        if param._version != version + 1 or self._versions[k] != version or not self._is_view(k):
            return
        with torch.no_grad():
            now = param.detach() if rows is None else param.detach().index_select(0, rows)
            changed = (now.view(torch.int16) != saved.view(torch.int16)).flatten(1).any(1)
            changed = changed.nonzero().flatten() if rows is None else rows[changed]
            if changed.numel():
                bucket.take_bf16_rows(i, tuple(param.shape), changed.to(torch.long))
        self._versions[k] = param._version

    def _take_write(self, param):
        """_take_writes for one parameter held as its plane's view (master_loading)."""
        self._take_writes((self._where[id(param)][3],))

    def _copied_onto_itself(self, param):
        """model.load_state_dict() copied `param` onto itself after its master was written or taken
        (master_loading): no bit changed, so the count torch's copy added is no write of the user's."""
        k = self._where[id(param)][3]
        if self._is_view(k):
            self._versions[k] = param._version

    def master(self, param):
        """The fp32 master value of `param` (a new tensor, bit-exact)."""
        bucket, i, k = self._find(param, "master()")
        self.wait_for_update()
        self._take_writes((k,))
        return bucket.merge(i, tuple(param.shape))

    def load_master(self, param, value):
        """Sets `param`'s fp32 master to `value` exactly (and its bf16 view to value's rounding)."""
        bucket, i, k = self._find(param, "load_master()", writes=True)
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(param.shape):
            raise InvalidArgumentError(f"load_master(): need a tensor of shape {tuple(param.shape)}")
        self.wait_for_update()
        bucket.split(i, value)
        self._versions[k] = param._version

    def master_state_dict(self, model):
        """model.state_dict() with every parameter of this optimizer replaced by its fp32 master:
        what an fp32 model (and plain torch.optim) loads to continue with the same numbers. Every key
        that names such a parameter gets it, tied ones too (head.weight = emb.weight), as one tensor."""
        out = model.state_dict()
        masters = {}
        # keep_vars: the parameters themselves, under every key (named_parameters() drops the aliases).
        for name, p in model.state_dict(keep_vars=True).items():
            found = self._where.get(id(p))
            if found is not None and found[2] is p:
                if id(p) not in masters:
                    masters[id(p)] = self.master(p)
                out[name] = masters[id(p)]
        return out

    def load_master_state_dict(self, model, state_dict):
        """The inverse: takes fp32 weights (e.g. a plain fp32 checkpoint) as the master."""
        self._check_views("load_master_state_dict()")  # before the first master is written
        for name, p in model.named_parameters():
            if id(p) in self._where:
                if name not in state_dict:
                    raise InvalidArgumentError(f"load_master_state_dict(): no '{name}' in the state dict")
                self.load_master(p, state_dict[name])

    def storage_bytes(self):
        """Bytes of the planes (bf16 + residual + tie bitmap), padding included."""
        return sum(b.nbytes() for b in self._buckets)

    # --- where the state lives (stowage.torch.offload) ---
    def state_placement(self, param):
        """"device", "mapped" or "streamed": where `param`'s m and v (momentum buffer) live."""
        self._find(param, "state_placement()")
        return self._homes.placement(param)

    def _state_tensors(self):
        return [(p, t) for p, s in self.state.items() for k, t in s.items() if k in self._state_keys]

    def state_device_bytes(self):
        """Bytes of optimizer state in device memory (on the CPU: PyTorch's), the streamed scratch included."""
        return self._homes.device_bytes(self._state_tensors())

    def state_host_bytes(self):
        """Bytes of optimizer state offloaded to host memory (on the CPU: stowage's)."""
        return self._homes.host_bytes(self._state_tensors())

    # --- the step ---
    def _grads(self):
        """The gradients to apply, after checking that every parameter still views its plane: the
        kernels write through the planes' cached addresses, so a parameter whose data was replaced
        (model.float()) would no longer train, and a storage moved in place (share_memory()) would
        be written after it was freed."""
        out = []
        for k, (group, bucket, i, p) in enumerate(self._flat):
            if not self._is_view(k):
                raise self._moved(k, "step()")
            g = p.grad
            if g is None:
                continue
            # Checked for every parameter before any is updated: a refused step changes nothing.
            if g.layout != torch.strided:
                raise sparse_gradient_error("step()", f"{self._which(k)} {tuple(p.shape)} has a {g.layout} "
                                            "gradient", "Nothing was written")
            if g.device != p.device or g.dtype not in (torch.bfloat16, torch.float32):
                raise InvalidArgumentError(f"step(): {self._which(k)} {tuple(p.shape)} has a gradient of {g.dtype} "
                                           f"on {g.device}: a dense bf16 or fp32 gradient on {p.device} is "
                                           "needed. Nothing was written")
            out.append((group, bucket, i, p, g.contiguous()))
        return out

    def _clip_coef(self, grads):
        if self.max_grad_norm is None or not grads:
            return 1.0
        # As torch.nn.utils.clip_grad_norm_: the 2-norm of all gradients, unscaled, in fp32.
        norms = torch.stack([torch.linalg.vector_norm(g.float(), 2.0) for *_, g in grads])
        total = float(torch.linalg.vector_norm(norms, 2.0)) / self.loss_scale
        return min(1.0, self.max_grad_norm / (total + 1e-6))

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Every group's hyper-parameters before any kernel: a value a scheduler or the loop set
        # that the kernels refuse would otherwise fail after earlier groups were stepped.
        for i, group in enumerate(self.param_groups):
            self._check_hyper_parameters(group, f"step(): param group {i}")
        grads = self._grads()
        if self._overlap is not None:
            self._check_overlap(grads)
        self._take_writes(range(len(self._flat)))
        batches, streamed = self._batched(grads)
        # One decision for the whole model, as a loss scaler makes it: any Inf/NaN skips every group.
        self.last_step_skipped = self.skip_nonfinite and self._any_nonfinite(batches, streamed)
        if self.last_step_skipped:
            # Where plain torch.optim would write NaN, the step is skipped: said, not silent (a loss
            # that stops moving is otherwise all a training loop would see).
            warnings.warn("step(): a gradient holds Inf or NaN, so this step was skipped and nothing written "
                          "(skip_nonfinite=True; opt.last_step_skipped says so per step)", RuntimeWarning,
                          stacklevel=callers_level())
            return loss
        clip = self._clip_coef(grads)
        # The state the kernels take by address, checked for every parameter before any is updated.
        for group, _, p, _ in streamed:
            self._fitted(group, p, self._state_for(group, p))
        for batch, _ in batches:
            for i, p in enumerate(batch.params):
                state = self._state_for(batch.group, p)
                if not batch.holds(i, state, self._stepped(batch.group, state)):
                    batch.bind(i, state, self._fitted(batch.group, p, state))
        for group, planes, p, g in streamed:
            self._update(group, planes, p, g, self.state[p], clip, self._placement(p.device))
        overlap = self._overlap
        if overlap is not None:
            overlap.begin({batch.device for batch, _ in batches if batch.device.type == "cuda"})
        for batch, entries in batches:
            group = batch.group
            batch.load_counts()
            side = overlap is not None and batch.device.type == "cuda"
            self._step_multi(group, batch.tensors, clip,
                             overlap.placement(batch.device) if side else self._placement(batch.device))
            batch.applied()
            if side:
                overlap.queued(batch.device, batch.chunk, [g for _, _, g in entries])
        return loss

    def wait_for_update(self):
        """With overlap_update: the current stream of each device waits for the update step()
        queued (stowage.torch.update_overlap). Reads of the weights after step() outside a
        module's forward call it first. Without overlap there is nothing to wait for."""
        if self._overlap is not None:
            self._overlap.join()

    def zero_grad(self, *args, **kwargs):
        """torch.optim's. With overlap_update, zeroing the gradients in place (set_to_none=False)
        first waits for the update that reads them; setting them to None does not."""
        if self._overlap is not None and not _sets_to_none(*args, **kwargs):
            self.wait_for_update()
        return super().zero_grad(*args, **kwargs)

    def _check_overlap(self, grads):
        """overlap_update's needs, checked before anything is written."""
        for group, bucket, i, p, g in grads:
            if self._overlap.chunk_of(p) is None:
                k = self._where[id(p)][3]
                raise InvalidArgumentError(
                    f"step(): overlap_update orders the update by the model's parameters, and {self._which(k)} "
                    "is in no model given to attach() (apply() attaches its model). Nothing was written")
        if any(p.device.type == "cuda" for _, _, _, p, _ in grads):
            from . import enabled
            if enabled() == "plain":
                raise InvalidArgumentError(
                    "step(): overlap_update needs an allocator that honours record_stream (the update reads the "
                    "gradients on a side stream), and PyTorch's plain pluggable allocator ignores it: enable "
                    "stowage with its shim, or keep PyTorch's allocator. Nothing was written")

    def _batched(self, grads):
        """The step's multi-tensor calls, one per param group and device (and chunk, with
        overlap_update: in chunk order), kept from step to step while the same parameters have
        gradients, each with its entries (parameter, planes, gradient); and the parameters whose
        state is streamed, which go through the one scratch one at a time."""
        items, streamed = {}, []
        for group, bucket, i, p, g in grads:
            planes = bucket.planes(i, p.numel())
            if self._homes.placement(p) == "streamed":
                streamed.append((group, planes, p, g))
            else:
                chunk = self._overlap.chunk_of(p) if self._overlap is not None else 0
                items.setdefault((id(group), p.device, chunk), (group, p.device, chunk, []))[3].append((p, planes, g))
        batches = []
        for key, (group, device, chunk, entries) in sorted(items.items(), key=lambda item: item[0][2]):
            batch = self._batch_cache.get(key)
            if batch is None or not batch.serves(entries):
                batch = self._batch_cache[key] = _Batch(group, device, entries, chunk)
            batch.set_grads(entries)
            batches.append((batch, entries))
        return batches, streamed

    def _update(self, group, planes, p, g, state, clip, where):
        """One parameter's step, its state in the tensors working() gives (streamed: copies)."""
        with self._homes.working(p, self._stepped(group, state)) as work:
            tensors = precision.step_tensors([(planes, g.data_ptr(), _grad_bits(g), *_pointers(work),
                                               self._count_of(state))])
            self._step_multi(group, tensors, clip, where)
        state["step"].fill_(float(tensors[0].step))

    def _any_nonfinite(self, batches, streamed):
        """One call for the multi-tensor batches of each device (on a device: one check per
        gradient on its current stream, one wait per call), one for the streamed parameters'
        gradients."""
        arrays = {}
        for batch, _ in batches:
            arrays.setdefault(batch.device, []).append(batch.tensors)
        for device, held in arrays.items():
            if self._check(held[0] if len(held) == 1 else _joined(held), device):
                return True
        by_device = {}
        for *_, g in streamed:
            by_device.setdefault(g.device, []).append(
                (precision.planes(0, 0, 0, g.numel(), "half_up"), g.data_ptr(), _grad_bits(g), 0, 0, 0))
        return any(self._check(precision.step_tensors(entries), device) for device, entries in by_device.items())

    def _check(self, tensors, device):
        if device.type == "cpu":
            return precision.any_nonfinite_multi(tensors)
        # The check's flag is PyTorch's memory: a process that keeps PyTorch's allocator makes no
        # stowage allocator for it. (The call waits for the check: no stream still uses the flag.)
        flag = self._flags.get(device)
        if flag is None:
            flag = self._flags[device] = torch.empty(1, dtype=torch.int32, device=device)
        return precision.any_nonfinite_multi(tensors, **self._placement(device), flag=flag.data_ptr())

    @staticmethod
    def _placement(device):
        """Where the kernels for `device`'s parameters run: the host ({}), or a CUDA device's
        current stream."""
        if device.type == "cpu":
            return {}
        return {"device": device.index if device.index is not None else torch.cuda.current_device(),
                "stream": torch.cuda.current_stream(device).cuda_stream}

    def _stepped(self, group, state):
        return [state[key] for key in self._stepped_keys(group)]

    def _fitted(self, group, p, state):
        """p's state tensors as the kernel takes them by address: fp32, contiguous, p's shape, in
        p's home (StateHomes). One put in opt.state by hand (torch.zeros_like(p) is bf16 now) is
        copied into such a tensor, its values kept, and stored back: the kernel would write 4
        bytes an element through its address. One with no such values is refused."""
        out = []
        for key in self._stepped_keys(group):
            t = state[key]
            if not self._homes.holds(p, t):
                which = lambda: self._which(self._where[id(p)][3])  # noqa: E731 (named only for an error)
                state[key] = t = self._homes.new(p, state_value(t, p, key, self._homes.home_devices(p), which))
            out.append(t)
        return out

    def _count_of(self, state):
        return int(state["step"].item()) if "step" in state else 0

    def state_dict(self):
        """torch.optim's format (state per parameter index, param_groups) plus 'stowage_master',
        the fp32 master of each parameter in the same order: plain torch.optim.AdamW loads it, and
        so does this optimizer, bit for bit. Offloaded state is there as the host tensors it lives in."""
        self.wait_for_update()
        self._homes.synchronize()  # a queued step may still write offloaded state
        sd = super().state_dict()
        # Each step count on its own: another optimizer loading this dict in the same process must
        # not share the view of this optimizer's counts.
        sd["state"] = {k: {**v, "step": v["step"].clone()} if "step" in v else v for k, v in sd["state"].items()}
        sd["stowage_master"] = [self.master(p) for _, _, _, p in self._flat]
        return sd

    def __getstate__(self):
        # torch.optim.Optimizer's keeps only defaults, state and param_groups: a copy or pickle
        # would lose the planes that hold the masters (and the addresses the step uses), and fail
        # at its first step. Refused where it is made instead.
        raise UnsupportedError(f"a {type(self).__name__} cannot be copied or pickled (copy.deepcopy, torch.save of "
                               "the optimizer): its fp32 masters live in its planes, not in param_groups. Save "
                               "and load optimizer.state_dict(), which carries them ('stowage_master')")

    def load_state_dict(self, state_dict):
        """Restores a state_dict() of this optimizer or of torch.optim's (the same algorithm): m, v,
        momentum and step as saved (fp32, in the parameters' shapes), and the master from
        'stowage_master' when present (otherwise the master stays: load it with
        load_master_state_dict()). Everything is checked first: a refused state changes nothing. The
        state goes to each parameter's placement (state_placement())."""
        self.wait_for_update()
        self._homes.synchronize()  # queued steps may still use the state about to be replaced
        groups, states = self._checked_state(state_dict)
        masters = state_dict.get("stowage_master")
        if masters is not None:
            self._check_views("load_state_dict()")  # the masters are written last: refuse before the state changes
        updates = [decoupled_as_torch_says({k: v for k, v in saved.items() if k != "params"}, group)
                   for saved, group in zip(groups, self.param_groups)]
        for i, update in enumerate(updates):
            if decoupled_disagree({**self.param_groups[i], **update}):
                raise InvalidArgumentError(f"load_state_dict(): param group {i}: decoupled_weight_decay and decoupled "
                                           "disagree (the step reads decoupled)")
        for update, group in zip(updates, self.param_groups):
            group.update(update)
        self.state.clear()
        self._batch_cache.clear()
        for (_, _, _, p), entry in zip(self._flat, states):
            if entry is not None:
                self.state[p] = entry
        if masters is not None:
            for (_, _, _, p), value in zip(self._flat, masters):
                self.load_master(p, value)

    def _checked_state(self, state_dict):
        """The saved groups and, per parameter in order, its new state (None: none saved)."""
        try:
            groups, saved_state = state_dict["param_groups"], state_dict["state"]
        except (TypeError, KeyError):
            raise InvalidArgumentError("load_state_dict(): not an optimizer state dict (no 'param_groups', "
                                       "'state')") from None
        if len(groups) != len(self.param_groups) or any(
                len(a["params"]) != len(b["params"]) for a, b in zip(groups, self.param_groups)):
            raise InvalidArgumentError("load_state_dict(): its param groups do not match this optimizer's")
        for g in groups:
            if g.get("amsgrad") or g.get("maximize"):
                raise UnsupportedError("load_state_dict(): amsgrad and maximize have no fused form")
        masters = state_dict.get("stowage_master")
        if masters is not None:
            if len(masters) != len(self._flat):
                raise InvalidArgumentError("load_state_dict(): stowage_master has the wrong number of tensors")
            for (_, _, _, p), m in zip(self._flat, masters):
                if not isinstance(m, torch.Tensor) or tuple(m.shape) != tuple(p.shape):
                    raise InvalidArgumentError(f"load_state_dict(): a stowage_master tensor is not of shape "
                                               f"{tuple(p.shape)}")
        ids = [i for g in groups for i in g["params"]]
        states = []
        for saved_id, (_, _, _, p) in zip(ids, self._flat):
            entry = saved_state.get(saved_id)
            states.append(None if entry is None else self._checked_entry(entry, p))
        return groups, states

    def _checked_entry(self, entry, p):
        return self._completed(checked_entry(entry, p, self._state_keys, type(self).__name__,
                                             lambda value: self._homes.new(p, value), self._optional_keys))

    _optional_keys = ()  # state keys torch.optim saves as None for "none yet"


def checked_entry(entry, p, state_keys, owner, home=None, optional=()):
    """One parameter's saved optimizer state as this module keeps it (fp32, contiguous, p's
    shape, in home(value) or on p's device; step a tensor), or InvalidArgumentError naming what
    does not fit. A key of `optional` saved as None is left out, as torch.optim reads it."""
    out = {}
    for key, value in entry.items():
        if key in optional and value is None:
            continue
        if key == "step":
            one = isinstance(value, (int, float)) or (isinstance(value, torch.Tensor) and value.numel() == 1)
            step = float(value) if one else -1.0
            if not (step >= 0 and step == int(step)):
                raise InvalidArgumentError(f"load_state_dict(): step {value!r} is not a count")
            out[key] = torch.tensor(step)
        elif key in state_keys:
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(p.shape):
                raise InvalidArgumentError(f"load_state_dict(): {key} is not a tensor of shape {tuple(p.shape)}")
            out[key] = home(value) if home else value.detach().to(device=p.device, dtype=torch.float32).clone(
                memory_format=torch.contiguous_format)
        else:
            raise InvalidArgumentError(f"load_state_dict(): '{key}' is not state of {owner} "
                                       f"({', '.join(state_keys)}, step)")
    return out


class SharedStorageAdamW(_SharedStorageOptimizer):
    """AdamW (decoupled weight decay; Adam's L2 term with decoupled=False) on shared storage.

    Arguments as torch.optim.AdamW's (by keyword only after weight_decay: torch's next positional
    one is amsgrad), plus: decoupled, rounding ("nearest_even": the bf16 weights are IEEE
    round-to-nearest-even of the master, as tensor.to(torch.bfloat16) gives; "half_up": MindSpeed's
    encoding, no tie bitmap), max_grad_norm (clips by the global 2-norm inside the fused step),
    skip_nonfinite (an Inf/NaN gradient anywhere skips the step; last_step_skipped says so) and
    loss_scale (gradients are divided by it in fp32). state_offload ("none", "mapped", "streamed")
    and state_device_budget (bytes of state each device keeps, or None): where m and v live
    (stowage.torch.offload). overlap_update: step() queues the update of CUDA parameters on a side
    stream and the next forward waits for it module by module (stowage.torch.update_overlap)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *, decoupled=True,
                 rounding="nearest_even", max_grad_norm=None, skip_nonfinite=True, loss_scale=1.0,
                 state_offload="none", state_device_budget=None, overlap_update=False):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, decoupled=decoupled)
        self._check_hyper_parameters(defaults, "SharedStorageAdamW()")
        super().__init__(params, defaults, rounding, max_grad_norm, skip_nonfinite, loss_scale, state_offload,
                         state_device_budget, overlap_update)

    _state_keys = ("exp_avg", "exp_avg_sq")

    def state_dict(self):
        """As the base's, each group saying decoupled_weight_decay as well: newer torch.optim.Adam
        takes a group without it as not decoupled, and would step an AdamW state as Adam's."""
        sd = super().state_dict()
        sd["param_groups"] = [g if "decoupled_weight_decay" in g else {**g, "decoupled_weight_decay": g.get("decoupled", True)}
                              for g in sd["param_groups"]]
        return sd

    @staticmethod
    def _check_hyper_parameters(group, what):
        """torch.optim.AdamW's rules, and finite (as the kernels take them)."""
        lr, betas, eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        betas_ok = isinstance(betas, (tuple, list)) and len(betas) == 2 and all(_below_one(b) for b in betas)
        if not (_finite_non_negative(lr) and betas_ok and _finite_non_negative(eps) and _finite_non_negative(wd)):
            raise InvalidArgumentError(f"{what}: invalid AdamW hyper-parameters lr={lr!r} betas={betas!r} "
                                       f"eps={eps!r} weight_decay={wd!r} (lr, eps and weight_decay finite and "
                                       ">= 0, each beta in [0, 1))")
        # torch's key (newer torch.optim.Adam), kept for a state_dict loaded into torch, must say the same.
        if decoupled_disagree(group):
            raise InvalidArgumentError(f"{what}: decoupled_weight_decay={group['decoupled_weight_decay']!r} and "
                                       f"decoupled={group['decoupled']!r} disagree (the step "
                                       "reads decoupled): give them the same value")

    @classmethod
    def _completed(cls, state):
        # A classmethod: apply() checks a resumed torch.optim state with it before any parameter moves.
        missing = [k for k in cls._state_keys if k not in state]
        if missing:
            raise InvalidArgumentError(f"load_state_dict(): the state has no {', '.join(missing)}")
        state.setdefault("step", torch.tensor(0.0))
        return state

    def _state_for(self, group, p):
        state = self.state[p]
        if not state:  # as torch.optim.AdamW: the state appears at the first step
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = self._homes.new(p)
            state["exp_avg_sq"] = self._homes.new(p)
        return state

    def _stepped_keys(self, group):
        """The state the kernel updates: state0 and state1 of a StepTensor."""
        return self._state_keys

    def _step_multi(self, group, tensors, clip, where):
        beta1, beta2 = group["betas"]
        precision.adam_step_multi(tensors, group["lr"], beta1, beta2, group["eps"], group["weight_decay"],
                                  group.get("decoupled", True), self.loss_scale, clip, skip_nonfinite=False, **where)


class SharedStorageSGD(_SharedStorageOptimizer):
    """SGD (PyTorch's formulation: momentum, dampening, nesterov, weight decay) on shared storage;
    positional as far as torch.optim.SGD's (params, lr, momentum, dampening, weight_decay, nesterov);
    the extra arguments, by keyword only, are SharedStorageAdamW's (state_offload moves the momentum
    buffer)."""

    def __init__(self, params, lr=1e-2, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 rounding="nearest_even", max_grad_norm=None, skip_nonfinite=True, loss_scale=1.0,
                 state_offload="none", state_device_budget=None, overlap_update=False):
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)
        self._check_hyper_parameters(defaults, "SharedStorageSGD()")
        super().__init__(params, defaults, rounding, max_grad_norm, skip_nonfinite, loss_scale, state_offload,
                         state_device_budget, overlap_update)

    _state_keys = ("momentum_buffer",)

    @staticmethod
    def _check_hyper_parameters(group, what):
        """torch.optim.SGD's rules, and finite (as the kernels take them)."""
        lr, momentum, dampening = group["lr"], group["momentum"], group["dampening"]
        wd, nesterov = group["weight_decay"], group["nesterov"]
        ok = (_finite_non_negative(lr) and _finite_non_negative(momentum) and _finite_non_negative(wd)
              and _as_kernel_float(dampening) is not None and math.isfinite(_as_kernel_float(dampening))
              and not (nesterov and (momentum <= 0 or dampening != 0)))
        if not ok:
            raise InvalidArgumentError(f"{what}: invalid SGD hyper-parameters lr={lr!r} momentum={momentum!r} "
                                       f"dampening={dampening!r} weight_decay={wd!r} nesterov={nesterov!r} (lr, "
                                       "momentum and weight_decay finite and >= 0; Nesterov needs a momentum and no "
                                       "dampening)")
    # torch.optim.SGD without momentum saves {"momentum_buffer": None} (1.13), and any SGD reads None
    # as "no buffer yet".
    _optional_keys = ("momentum_buffer",)

    @classmethod
    def _completed(cls, state):
        # torch.optim.SGD keeps no step: a saved momentum buffer means at least one step was taken,
        # so the next one must not start the buffer afresh.
        if "step" not in state:
            state["step"] = torch.tensor(1.0 if "momentum_buffer" in state else 0.0)
        return state

    def _state_for(self, group, p):
        state = self.state[p]
        if "step" not in state:
            state["step"] = torch.tensor(0.0)
        if group["momentum"] != 0 and state.get("momentum_buffer") is None:  # None: none yet, as torch.optim reads it
            # As torch.optim.SGD, a parameter without a buffer starts it afresh (buf = g), which the
            # kernel does at count 0: a count kept from steps without momentum must not carry over.
            if float(state["step"]) != 0:
                state["step"] = torch.tensor(0.0)
            state["momentum_buffer"] = self._homes.new(p)
        return state

    def state_dict(self):
        """As the shared-storage optimizers', and a parameter stepped without momentum has
        "momentum_buffer": None, as torch.optim.SGD saves it."""
        sd = super().state_dict()
        for group in sd["param_groups"]:
            if group["momentum"] == 0:
                for i in group["params"]:
                    if i in sd["state"]:
                        sd["state"][i] = {"momentum_buffer": None, **sd["state"][i]}
        return sd

    def _stepped_keys(self, group):
        return self._state_keys if group["momentum"] != 0 else ()

    def _step_multi(self, group, tensors, clip, where):
        precision.sgd_step_multi(tensors, group["lr"], group["momentum"], group["dampening"], group["weight_decay"],
                                 group["nesterov"], self.loss_scale, clip, skip_nonfinite=False, **where)
