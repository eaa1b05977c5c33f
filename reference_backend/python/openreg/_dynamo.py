"""torch._dynamo's device interface and Inductor's backend for OpenReg.

Dynamo and Inductor look devices up with
``torch._dynamo.device_interface.get_interface_for_device(name)``; PyTorch
2.13 registers CUDA, XPU, MPS, MTIA and CPU there, never a PrivateUse1
backend. Inductor looks a device's code generators up in its registry
(``register_backend_for_device``). Importing either costs seconds, so
``import openreg`` does not do it: it installs post-import hooks that
register OpenReg the moment anything imports
``torch._dynamo.device_interface`` or Inductor's compiler,
``torch._inductor.compile_fx`` (or at once if it already has been).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

_DYNAMO = "torch._dynamo.device_interface"
_INDUCTOR = "torch._inductor.compile_fx"


def _register() -> None:
    import torch
    from torch._dynamo.device_interface import DeviceInterface, register_interface_for_device

    import openreg

    class OpenRegInterface(DeviceInterface):
        device = openreg.device
        Event = openreg.Event
        Stream = openreg.Stream

        class Worker:
            # Called from compile workers without initializing anything heavy.
            set_device = staticmethod(openreg.set_device)
            current_device = staticmethod(openreg.current_device)
            get_device_properties = staticmethod(openreg.get_device_properties)

        current_device = staticmethod(openreg.current_device)
        set_device = staticmethod(openreg.set_device)
        exchange_device = staticmethod(openreg._exchange_device)
        maybe_exchange_device = staticmethod(openreg._maybe_exchange_device)
        device_count = staticmethod(openreg.device_count)
        is_available = staticmethod(openreg.is_available)
        stream = staticmethod(openreg.stream)
        current_stream = staticmethod(openreg.current_stream)
        set_stream = staticmethod(openreg.set_stream)
        synchronize = staticmethod(openreg.synchronize)
        memory_allocated = staticmethod(openreg.memory_allocated)

        @staticmethod
        def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
            openreg.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index,
                                            device_type=device_type))

        @staticmethod
        def get_raw_stream(device_idx: int) -> int:
            return openreg.current_stream(device_idx).native_handle

        @classmethod
        def get_device_properties(cls, device: Any = None) -> Any:
            return openreg.get_device_properties(device)

        @staticmethod
        def get_compute_capability(device: Any = None) -> str:
            return ""  # no compute capability: not a GPU

        @staticmethod
        def is_bf16_supported(including_emulation: bool = False) -> bool:
            return True

        @staticmethod
        def is_triton_capable(device: Any = None) -> bool:
            return False

        # torch 2.15's device-class questions (earlier releases never ask).
        # Inductor generates CPU-style C++ for OpenReg: not a GPU-class device.
        @staticmethod
        def is_gpu() -> bool:
            return False

        @classmethod
        def get_multi_processor_count(cls, device: Any = None) -> int:
            return openreg.get_device_properties(device).multi_processor_count

    register_interface_for_device("openreg", OpenRegInterface)
    for index in range(openreg.device_count()):
        register_interface_for_device(f"openreg:{index}", OpenRegInterface)


def _register_inductor() -> None:
    from openreg import _inductor

    _inductor.register()


_HOOKS = {_DYNAMO: _register, _INDUCTOR: _register_inductor}


class _Loader(importlib.abc.Loader):
    def __init__(self, wrapped: importlib.abc.Loader, then) -> None:  # type: ignore[no-untyped-def]
        self.wrapped = wrapped
        self.then = then

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self.wrapped.create_module(spec)

    def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
        self.wrapped.exec_module(module)
        self.then()


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.pending = {name: hook for name, hook in _HOOKS.items() if name not in sys.modules}

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        hook = self.pending.pop(fullname, None)
        if hook is None:
            return None
        if not self.pending:
            sys.meta_path.remove(self)  # every hook has run
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, hook)
        return spec


def install() -> None:
    finder = _Finder()
    for name, hook in _HOOKS.items():
        if name in sys.modules:
            hook()
    if finder.pending:
        sys.meta_path.insert(0, finder)
