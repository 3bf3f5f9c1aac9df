"""stowage's errors in Python: one class per kind the C ABI reports (stowage_last_error_code)."""


class StowageError(RuntimeError):
    """Any error from stowage."""


class InvalidArgumentError(StowageError, ValueError):
    """A bad pointer, size, device, stream, or a double free: nothing was changed."""


class OutOfMemoryError(StowageError, MemoryError):
    """The device or the memory cap refused; the message is stowage's full report."""


class ConfigError(StowageError):
    """A malformed STOWAGE_* variable or input file."""


class UnsupportedError(StowageError):
    """What was asked is not supported here."""


class DeviceError(StowageError):
    """The device or its driver failed."""


_BY_CODE = {1: InvalidArgumentError, 2: OutOfMemoryError, 3: ConfigError, 4: UnsupportedError, 5: DeviceError}


def error_for(code, message):
    return _BY_CODE.get(code, StowageError)(message or "stowage: unknown error")
