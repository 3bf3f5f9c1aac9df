"""Loads libstowage and declares its C ABI (runtime/include/stowage/stowage.h) for ctypes.

Plain ctypes, so the package works under any Python 3 with or without PyTorch. The library is
looked for, in order, at $STOWAGE_LIBRARY, beside this package, through the system's loader
(after `cmake --install`), and in a build folder of the source tree the package sits in.
"""
import ctypes
import ctypes.util
import functools
import operator
import os
import threading

from .errors import InvalidArgumentError, StowageError, error_for

_lock = threading.Lock()
_lib = None

# Where a checkout keeps its build (python/ beside build/).
_SOURCE_BUILDS = ("build", "build-asan", "build-tsan")


def _candidates():
    explicit = os.environ.get("STOWAGE_LIBRARY")
    if explicit:
        return [explicit], True
    here = os.path.dirname(os.path.abspath(__file__))
    found = [os.path.join(here, "libstowage.so")]
    system = ctypes.util.find_library("stowage")
    if system:
        found.append(system)
    root = os.path.dirname(os.path.dirname(here))
    found += [os.path.join(root, b, "libstowage.so") for b in _SOURCE_BUILDS]
    return found, False


def _declare(lib):
    c_ssize = ctypes.c_ssize_t
    sig = {
        "stowage_malloc": (ctypes.c_void_p, [c_ssize, ctypes.c_int, ctypes.c_void_p]),
        "stowage_free": (None, [ctypes.c_void_p, c_ssize, ctypes.c_int, ctypes.c_void_p]),
        "stowage_empty_cache": (ctypes.c_int, [ctypes.c_int]),
        "stowage_record_stream": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]),
        "stowage_get_stats": (c_ssize, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]),
        "stowage_reset_peak_stats": (ctypes.c_int, [ctypes.c_int]),
        "stowage_snapshot": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p]),
        "stowage_snapshot_json": (c_ssize, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]),
        "stowage_set_memory_cap": (ctypes.c_int, [ctypes.c_int, ctypes.c_size_t]),
        "stowage_set_memory_fraction": (ctypes.c_int, [ctypes.c_int, ctypes.c_double]),
        "stowage_device_capacity": (c_ssize, [ctypes.c_int]),
        "stowage_push_tag": (ctypes.c_int, [ctypes.c_char_p]),
        "stowage_pop_tag": (ctypes.c_int, []),
        "stowage_dlpack_empty": (ctypes.c_void_p, [ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.c_int,
                                                   ctypes.c_uint8, ctypes.c_uint8, ctypes.c_void_p]),
        "stowage_host_malloc": (ctypes.c_void_p, [c_ssize, ctypes.c_int]),
        "stowage_host_free": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int]),
        "stowage_dlpack_host_empty": (ctypes.c_void_p, [ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.c_int,
                                                        ctypes.c_uint8, ctypes.c_uint8]),
        "stowage_host_device_pointer": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int]),
        "stowage_host_stats": (c_ssize, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]),
        "stowage_host_release_unused": (c_ssize, [ctypes.c_int]),
        "stowage_block_device": (ctypes.c_int, [ctypes.c_void_p]),
        "stowage_device_count": (ctypes.c_int, []),
        "stowage_using_cuda": (ctypes.c_int, []),
        "stowage_split": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),
        "stowage_merge": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),
        "stowage_any_nonfinite": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]),
        "stowage_adam_step": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]),
        "stowage_sgd_step": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]),
        "stowage_adam_step_async": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p] + [ctypes.c_void_p, ctypes.c_void_p,
                                                                                   ctypes.c_int] +
                                    [ctypes.c_void_p] * 5),
        "stowage_sgd_step_async": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                                  ctypes.c_int] + [ctypes.c_void_p] * 4),
        "stowage_any_nonfinite_multi": (ctypes.c_int, [ctypes.c_size_t, ctypes.c_void_p]),
        "stowage_any_nonfinite_multi_async": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                                                             ctypes.c_void_p, ctypes.c_void_p]),
        "stowage_adam_step_multi": (ctypes.c_int, [ctypes.c_size_t] + [ctypes.c_void_p] * 3),
        "stowage_sgd_step_multi": (ctypes.c_int, [ctypes.c_size_t] + [ctypes.c_void_p] * 3),
        "stowage_adam_step_multi_async": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t] +
                                          [ctypes.c_void_p] * 3),
        "stowage_sgd_step_multi_async": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t] +
                                         [ctypes.c_void_p] * 3),
        "stowage_synchronize": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]),
        "stowage_last_error": (ctypes.c_char_p, []),
        "stowage_last_error_code": (ctypes.c_int, []),
        # Handed to PyCapsule_New as a function pointer (stowage.dlpack), never called from Python.
        "stowage_dlpack_capsule_destructor": (None, [ctypes.c_void_p]),
    }
    for name, (restype, argtypes) in sig.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise StowageError(f"{lib._name} has no {name}: it is older than this package; rebuild stowage") from None
        fn.restype = restype
        fn.argtypes = argtypes
        ints = [(i, t) for i, t in enumerate(argtypes) if t in _INTEGERS]
        if ints and name != "stowage_dlpack_capsule_destructor":
            setattr(lib, name, _range_checked(name, fn, ints))


# ctypes converts a Python int to a C integer modulo its width, silently: raw_alloc(2**64 + 100)
# would allocate 100 bytes and device 2**32 would be device 0. Every integer argument is checked.
_INTEGERS = (ctypes.c_int, ctypes.c_uint8, ctypes.c_size_t, ctypes.c_ssize_t, ctypes.c_int64, ctypes.c_void_p)


@functools.lru_cache(maxsize=None)
def _bounds(ctype):
    bits = 8 * ctypes.sizeof(ctype)
    unsigned = ctype(-1).value != -1
    kind = "an address" if ctype is ctypes.c_void_p else f"a C {'un' if unsigned else ''}signed {bits}-bit integer"
    return (0, (1 << bits) - 1, kind) if unsigned else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1, kind)


def _as_int(value):
    """The integer ctypes would take `value` as (an int, a numpy integer: anything with __index__),
    or None for what it takes otherwise (None, a ctypes object, bytes)."""
    if isinstance(value, int):
        return value
    return operator.index(value) if hasattr(type(value), "__index__") else None


def fits(value, ctype, what):
    """`value` as it goes into a C integer (or pointer) of `ctype`; InvalidArgumentError where ctypes
    would wrap it."""
    lo, hi, kind = _bounds(ctype)
    number = _as_int(value)
    if number is not None and not lo <= number <= hi:
        raise InvalidArgumentError(f"{what}: {number} does not fit {kind} ({lo}..{hi})")
    return value


def _range_checked(name, fn, ints):
    checks = [(i, ctype, f"{name}: argument {i + 1}") for i, ctype in ints]

    def call(*args):
        for i, ctype, what in checks:
            if i < len(args):
                fits(args[i], ctype, what)
        return fn(*args)
    call.__name__ = name
    return call


def library():
    """The loaded libstowage (ctypes.CDLL); StowageError naming every place looked in."""
    global _lib
    lib = _lib
    if lib is not None:  # loaded: no lock on the path every call takes
        return lib
    with _lock:
        if _lib is not None:
            return _lib
        paths, explicit = _candidates()
        tried = []
        for path in paths:
            if not explicit and os.sep in path and not os.path.exists(path):
                tried.append(f"{path} (no such file)")
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                tried.append(f"{path} ({e})")
                continue
            _declare(lib)
            _lib = lib
            return lib
        hint = "STOWAGE_LIBRARY names it" if explicit else "set STOWAGE_LIBRARY to libstowage.so's path"
        raise StowageError("cannot load libstowage: tried " + "; ".join(tried) + f" ({hint})")


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _loaded_file(lib):
    """The file the loader mapped for `lib`: its name may be a bare soname found through the
    system's search path (find_library gives "libstowage.so.0"), which names no file."""
    for libc in (None, "libdl.so.2"):
        try:
            dladdr = ctypes.CDLL(libc).dladdr
        except (OSError, AttributeError):
            continue
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        dladdr.restype = ctypes.c_int
        info = _DlInfo()
        if dladdr(ctypes.cast(lib.stowage_device_count, ctypes.c_void_p), ctypes.byref(info)) and info.dli_fname:
            return os.path.abspath(os.fsdecode(info.dli_fname))
    raise StowageError(f"cannot find the file {lib._name} was loaded from (dladdr is missing)")


def path():
    """The file the library was loaded from (an absolute path)."""
    lib = library()
    if os.path.isabs(lib._name):
        return lib._name
    return _loaded_file(lib)


def check(result, failed):
    """Raises the error the calling thread's last stowage call left when `failed(result)`."""
    if failed(result):
        lib = library()
        raise error_for(lib.stowage_last_error_code(), lib.stowage_last_error().decode(errors="replace"))
    return result


def call_int(name, *args):
    lib = library()
    result = getattr(lib, name)(*args)
    if result == -1:
        raise error_for(lib.stowage_last_error_code(), lib.stowage_last_error().decode(errors="replace"))
    return result


def read_text(name, device):
    """Calls a (device, buf, len) -> length function twice: once to size, once to fill."""
    fn = getattr(library(), name)
    need = check(fn(device, None, 0), lambda r: r < 0)
    buf = ctypes.create_string_buffer(need + 1)
    got = check(fn(device, buf, need + 1), lambda r: r < 0)
    if got != need:  # it grew between the calls: one more try with the new size
        return read_text(name, device)
    return buf.value.decode()
