"""Per-instance forward replacement: one module's forward changes, its class and every other instance don't."""
import functools
from contextlib import contextmanager

from torch import nn

_PLAIN_FORWARD = "_lanner_plain_forward"


def bind_forward(module: nn.Module, fast_forward, **bound) -> None:
    """Makes module(...) call fast_forward(module, ..., **bound); the original stays reachable by plain_forward."""
    if is_patched(module):
        unbind_forward(module)
    object.__setattr__(module, _PLAIN_FORWARD, module.forward)
    module.forward = functools.partial(fast_forward, module, **bound)


def plain_forward(module: nn.Module):
    """The forward the module had before it was patched."""
    return getattr(module, _PLAIN_FORWARD)


def is_patched(module: nn.Module) -> bool:
    return _PLAIN_FORWARD in module.__dict__


def unbind_forward(module: nn.Module) -> None:
    if is_patched(module):
        del module.__dict__[_PLAIN_FORWARD]
        del module.__dict__["forward"]


@contextmanager
def plain_forwards(modules):
    """The patched ones among modules run their own forwards inside the block, their patched ones again after it."""
    saved = [(module, module.__dict__.pop("forward"), module.__dict__.pop(_PLAIN_FORWARD))
             for module in modules if is_patched(module)]
    try:
        yield
    finally:
        for module, fast, plain in saved:
            object.__setattr__(module, _PLAIN_FORWARD, plain)
            module.forward = fast
