"""What the techniques that wrap an unmodified model's modules share: replacing a module's
forward so it can be put back, and the handle that puts everything back."""
from ..errors import InvalidArgumentError


def storage_of(t):
    """The tensor's bytes as an untyped storage: untyped_storage() from torch 2.0; 1.13 has only
    the TypedStorage view of the same StorageImpl."""
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage().untyped()


class WrapHandle:
    """.stats (the technique's statistics), .modules (the wrapped modules' names), .remove() (the
    model as it was). Also a context manager."""

    def __init__(self, stats, modules, undo):
        self.stats, self.modules, self._undo = stats, modules, undo

    def remove(self):
        while self._undo:
            self._undo[-1]()  # may refuse (another wrapper on top): then nothing more is undone
            self._undo.pop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def set_forward(module, forward, undo):
    """module.forward = forward, with a restore appended to `undo` (a forward set on the instance
    before is put back; otherwise the class's shows through again)."""
    had = "forward" in module.__dict__
    old = module.__dict__.get("forward")

    def restore():
        if module.__dict__.get("forward") is not forward:
            raise InvalidArgumentError("remove(): another wrapper was put on this module's forward after this "
                                       "one; remove the handles in the reverse order of their creation")
        if had:
            module.forward = old
        else:
            del module.forward
    module.forward = forward
    undo.append(restore)
