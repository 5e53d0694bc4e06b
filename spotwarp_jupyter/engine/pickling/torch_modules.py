"""Compiled and parametrized torch modules: saved as what they were made from, made again on restore.

`torch.compile(module)` (or of a function) is saved as "compile it again with the same backend and options": the
module itself is saved in the stream (its parameters stay the very tensors an optimizer of the same group holds),
and the restored one is compiled anew on its first call; nothing of dynamo's own state (guards, caches, config
modules) is saved. A module with parametrizations (`parametrize`, `weight_norm`, `orthogonal`) is saved as its own
class and state, parametrizations and their original tensors included, and gets its parametrized properties back:
the originals an optimizer trains are the ones restored.
"""

from __future__ import annotations

import sys
from typing import Any

from .data import _new_instance


def is_compiled_module(cls: type) -> bool:
    """Whether `cls` is what `torch.compile` returns for a module."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return eval_frame is not None and issubclass(cls, eval_frame.OptimizedModule)


def is_parametrized_module(cls: type) -> bool:
    """Whether `cls` is the class `torch.nn.utils.parametrize` puts on a module it parametrizes."""
    getstate = cls.__dict__.get("__getstate__")
    return (getattr(getstate, "__module__", None) == "torch.nn.utils.parametrize"
            and getattr(getstate, "__qualname__", "").startswith("_inject_new_class."))


def is_compiled_function(fn: Any) -> bool:
    """Whether the function `fn` is what `torch.compile` returns for a function."""
    return getattr(fn, "_is_torch_compile", False) is True and callable(getattr(fn, "_torchdynamo_orig_callable", None))


def _compile_options(ctx: Any) -> dict[str, Any] | None:
    """The keywords `torch.compile` was given (backend, fullgraph, dynamic, mode/options), read back from the
    compiled object's dynamo context; None when they cannot be found (another torch layout)."""
    import torch

    backend = getattr(ctx, "callback", None)
    for _ in range(8):  # CatchErrorsWrapper -> ConvertFrame -> ConvertFrameAssert -> WrapBackendDebug -> the wrapper
        if isinstance(backend, (torch._TorchCompileWrapper, torch._TorchCompileInductorWrapper)):
            break
        backend = getattr(backend, "_inner_convert", None) or getattr(backend, "_torchdynamo_orig_backend", None)
    else:
        return None
    options: dict[str, Any] = {"fullgraph": bool(getattr(ctx, "fullgraph", False)), "dynamic": backend.dynamic}
    if isinstance(backend, torch._TorchCompileInductorWrapper):
        if type(backend) is not torch._TorchCompileInductorWrapper:  # the AOT variant: not rebuilt from options
            return None
        options["backend"] = "inductor"
        if backend.config:  # the mode's settings and the options given, as the inductor applies them
            options["options"] = dict(backend.config)
        return options
    from torch._dynamo.backends.registry import lookup_backend

    name = backend.compiler_name
    try:
        registered = lookup_backend(name) is backend.compiler_fn
    except Exception:  # noqa: BLE001 - not a registered name: a function of the user's
        registered = False
    options["backend"] = name if registered else backend.compiler_fn
    options.update(backend.kwargs)  # mode / options
    return options


def _reduce_compiled(compiled: Any):
    options = _compile_options(getattr(compiled, "dynamo_ctx", None))
    if options is None:
        return NotImplemented
    return (_compile_again, (compiled._orig_mod, options))


def _reduce_compiled_function(fn: Any):
    free = fn.__code__.co_freevars
    ctx = fn.__closure__[free.index("self")].cell_contents if "self" in free and fn.__closure__ else None
    options = _compile_options(ctx)
    if options is None:
        return NotImplemented
    return (_compile_again, (fn._torchdynamo_orig_callable, options))


def _compile_again(target: Any, options: dict[str, Any]) -> Any:
    import torch

    return torch.compile(target, **options)


def _reduce_parametrized(module: Any):
    base = type(module).__bases__[0]  # the module's own class, under the one parametrize injected
    state = dict(module.__dict__)
    return (_new_instance, (base,), state, None, None, _set_parametrized_state)


def _set_parametrized_state(module: Any, state: dict[str, Any]) -> None:
    from torch.nn.utils import parametrize

    module.__dict__.update(state)
    parametrize._inject_new_class(module)
    for name in module._modules["parametrizations"]:
        parametrize._inject_property(module, name)
