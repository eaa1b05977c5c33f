"""OpenReg: the reference PrivateUse1 backend, a simulated accelerator.

``import openreg`` claims PyTorch's PrivateUse1 dispatch key under the name
``openreg``: it loads the C++ backend (device guard, hooks, allocators,
generators, kernels), renames the key, registers this module as
``torch.openreg`` and generates ``Tensor.openreg()`` / ``Tensor.is_openreg``
and friends. ``import torch`` runs this import itself through OpenReg's
``torch.backends`` entry point (see ``openreg_autoload``; off with
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` or ``OPENREG_AUTOLOAD=0``).

Devices are configured once per process by environment variables, read when
this module is first imported:

* ``OPENREG_DEVICE_COUNT``: number of devices (default 2; 0 means none),
* ``OPENREG_DEVICE_MEMORY``: bytes per device (default 4 GiB; suffixes K, M,
  G, T allowed).
"""

from __future__ import annotations

import os
import re
import sys
import threading
import traceback
from typing import Any

import torch


def _check_privateuse1_is_free() -> None:
    """Refuse to load when another backend holds PrivateUse1: loading our
    library would register a second set of kernels, guard and hooks."""
    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", "openreg"):
        raise RuntimeError(
            f"Cannot load OpenReg: PrivateUse1 is already claimed by the backend {name!r} "
            "in this process (only one PrivateUse1 backend can be loaded)"
        )


_check_privateuse1_is_free()


def _load_compiled() -> Any:
    """Load the compiled backend, built against this very torch release."""
    running = re.match(r"\d+\.\d+\.\d+", torch.__version__).group()  # '2.14.0a0+git1234' -> '2.14.0'
    rebuild = "rebuild it in this environment with `pip install --no-build-isolation ./reference_backend`"
    try:
        from . import _C  # loading it registers the backend with PyTorch
    except ImportError as e:
        raise ImportError(f"OpenReg's compiled library does not load with torch {torch.__version__} (it was probably "
                          f"built against another torch): {rebuild} ({e})") from e
    if _C._built_with_torch != running:
        raise ImportError(f"OpenReg was built against torch {_C._built_with_torch}, this is torch {torch.__version__}: "
                          f"{rebuild}")
    return _C


_C = _load_compiled()

# OPENREG_ASYNC_OPERATORS (read by the library when it loaded): anything but
# unset, empty, 0 or 1 is an error, not a silent default.
if os.environ.get("OPENREG_ASYNC_OPERATORS", "1") not in ("", "0", "1"):
    raise ValueError(f"OPENREG_ASYNC_OPERATORS={os.environ['OPENREG_ASYNC_OPERATORS']!r}: expected 1 (asynchronous "
                     "operators, the default) or 0 (operators wait for their stream; "
                     "docs/reference-backend/streams-and-events.md)")
__all__ = [
    "Event",
    "Stream",
    "current_device",
    "current_stream",
    "default_generators",
    "default_stream",
    "device",
    "device_count",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_device_name",
    "get_device_properties",
    "get_per_process_memory_fraction",
    "get_rng_state",
    "get_rng_state_all",
    "init",
    "initial_seed",
    "is_available",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_per_process_memory_fraction",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
]

_BACKEND_NAME = "openreg"

# ---------------------------------------------------------------- lazy init

_initialized = False
_init_lock = threading.Lock()
_init_traceback: str | None = None


def _is_in_bad_fork() -> bool:
    """True in a child forked after OpenReg was initialized in the parent."""
    return _C._is_in_bad_fork()


def is_initialized() -> bool:
    """Whether OpenReg has been initialized in this process. Never initializes."""
    return _initialized and not _is_in_bad_fork()


def _lazy_init() -> None:
    """Initialize OpenReg once (PyTorch calls this before first device use)."""
    global _initialized, _init_traceback
    if _is_in_bad_fork():
        raise RuntimeError(
            "Cannot re-initialize OpenReg in a forked subprocess: OpenReg was "
            "initialized in the parent process before fork(). To use OpenReg "
            "with multiprocessing, use the 'spawn' start method."
        )
    if _initialized:
        return
    with _init_lock:
        if _initialized:
            return
        _C._init()
        _init_traceback = "".join(traceback.format_stack())
        _initialized = True


def init() -> None:
    """Initialize OpenReg explicitly (optional: it happens on first use)."""
    _lazy_init()


# -------------------------------------------------------- device management


def is_available() -> bool:
    """Whether at least one OpenReg device exists. Never raises, never initializes."""
    try:
        return _C._device_count() > 0
    except Exception:  # noqa: BLE001 - the contract is "never raises"
        return False


def device_count() -> int:
    """Number of OpenReg devices. Never raises, never initializes."""
    try:
        return _C._device_count()
    except Exception:  # noqa: BLE001
        return 0


def _device_index(device: Any, *, optional: bool) -> int:
    """Index of `device` (int, str, torch.device or None), -1 for "current"."""
    if device is None:
        if optional:
            return -1
        raise ValueError("Expected an OpenReg device or an index, but got None")
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
        raise TypeError(
            f"Expected an int, str or torch.device for the OpenReg device, but got "
            f"{type(device).__name__}"
        )
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != _BACKEND_NAME:
            raise ValueError(
                f"Expected an OpenReg device ({_BACKEND_NAME!r}), but got a "
                f"{device.type!r} device"
            )
        if device.index is None:
            if optional:
                return -1
            raise ValueError(
                f"Expected an OpenReg device with an index or an int, but got {device}"
            )
        return device.index
    return device


def _resolve_device(device: Any) -> int:
    """The index `device` names (None: the current device), validated:
    out-of-range indices raise RuntimeError naming the index and the range,
    like every OpenReg entry point."""
    index = _device_index(device, optional=True)
    if index == -1:
        return current_device()
    count = device_count()
    if not 0 <= index < count:
        raise RuntimeError(
            f"OpenReg: device={index} is out of range: valid device indices are [0, {count})"
            if count else f"OpenReg: device={index} is invalid: {_C._no_devices_reason()}"
        )
    return index


# Index of the current OpenReg device of the calling thread (0 in new
# threads). In C++: it initializes lazily through _lazy_init on first use.
current_device = _C.current_device


def set_device(device: Any) -> None:
    """Make `device` current for the calling thread.

    -1 is a no-op, as in ``torch.accelerator.set_device_index``. Any other
    index outside ``[0, device_count())`` (including -2 and below, which
    torch.cuda.set_device silently ignores) raises RuntimeError naming the
    index and the range, and changes nothing. A torch.device without an
    index raises ValueError, as torch.accelerator.set_device_index does.
    """
    index = device if type(device) is int else _device_index(device, optional=False)
    if index == -1:
        return
    _lazy_init()
    _C._set_device(index)


def _exchange_device(device: int) -> int:
    """Set `device` and return the previous device (-1: no change, returns -1)."""
    if device == -1:
        return -1
    _lazy_init()
    return _C._exchange_device(device)


def _maybe_exchange_device(device: int) -> int:
    """Like _exchange_device, but an invalid index changes nothing."""
    if device == -1:
        return -1
    _lazy_init()
    return _C._maybe_exchange_device(device)


class device:
    """Context manager that makes `device` current and restores the previous one.

    ``None`` and -1 do nothing. Restores on exit, also when an exception
    escapes; nested contexts restore in LIFO order.
    """

    def __init__(self, device: Any) -> None:
        self.idx = _device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self) -> None:
        self.prev_idx = _exchange_device(self.idx)

    def __exit__(self, *exc_info: object) -> bool:
        self.idx = _maybe_exchange_device(self.prev_idx)
        return False


def synchronize(device: Any = None) -> None:
    """Wait for all work on all streams of `device` (default: current device)."""
    _lazy_init()
    index = _device_index(device, optional=True)
    _C._synchronize(index)


# ------------------------------------------------------------------ random


def _generator(device: Any) -> torch.Generator:
    index = _device_index(device, optional=True)
    return _C._default_generator(index)


def manual_seed(seed: int) -> None:
    """Seed the current device's default generator."""
    _generator(None).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seed the default generators of all devices (torch.manual_seed calls this)."""
    seed = int(seed)
    for generator in default_generators:
        generator.manual_seed(seed)


def seed() -> None:
    """Seed the current device's generator with a non-deterministic number."""
    _generator(None).seed()


def seed_all() -> None:
    """Seed all default generators with one non-deterministic number."""
    if not default_generators:
        return
    value = default_generators[0].seed()
    for generator in default_generators[1:]:
        generator.manual_seed(value)


def initial_seed() -> int:
    """The seed of the current device's default generator."""
    return _generator(None).initial_seed()


def get_rng_state(device: Any = _BACKEND_NAME) -> torch.Tensor:
    """The state of `device`'s default generator (a CPU ByteTensor)."""
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = _BACKEND_NAME) -> None:
    """Restore `device`'s default generator from get_rng_state()."""
    _generator(device).set_state(new_state.clone(memory_format=torch.contiguous_format))


def get_rng_state_all() -> list[torch.Tensor]:
    return [generator.get_state() for generator in default_generators]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    if len(new_states) != len(default_generators):
        raise ValueError(
            f"set_rng_state_all: expected {len(default_generators)} states (one per "
            f"device), got {len(new_states)}"
        )
    for index, state in enumerate(new_states):
        set_rng_state(state, index)


# ------------------------------------------------------------------ memory


def _stats_device(device: Any) -> int:
    return _resolve_device(device)


def memory_stats(device: Any = None) -> dict[str, Any]:
    """Allocator statistics of `device` (flattened, as torch.accelerator.memory_stats)."""
    return torch.accelerator.memory_stats(_stats_device(device))


def memory_allocated(device: Any = None) -> int:
    return torch.accelerator.memory_allocated(_stats_device(device))


def max_memory_allocated(device: Any = None) -> int:
    return torch.accelerator.max_memory_allocated(_stats_device(device))


def memory_reserved(device: Any = None) -> int:
    return torch.accelerator.memory_reserved(_stats_device(device))


def max_memory_reserved(device: Any = None) -> int:
    return torch.accelerator.max_memory_reserved(_stats_device(device))


def reset_peak_memory_stats(device: Any = None) -> None:
    torch._C._accelerator_resetPeakStats(_stats_device(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    torch._C._accelerator_resetAccumulatedStats(_stats_device(device))


def empty_cache() -> None:
    """Return cached device memory (and deferred pinned memory) to the runtime."""
    torch._C._accelerator_emptyCache()
    _C._empty_host_cache()


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Limit the memory this process may reserve on `device` (default:
    current) to `fraction` of its total memory; an allocation beyond it
    raises torch.OutOfMemoryError (after the cache is released)."""
    if not isinstance(fraction, float):
        raise TypeError(f"set_per_process_memory_fraction: fraction must be a float, not {type(fraction).__name__}")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"set_per_process_memory_fraction: fraction={fraction} is out of range: valid fractions are "
                         "[0, 1]")
    index = _resolve_device(device)
    _C._set_memory_fraction(fraction, index)


def get_per_process_memory_fraction(device: Any = None) -> float:
    """The share of `device`'s memory this process may reserve (1.0 unless set)."""
    return _C._get_memory_fraction(_resolve_device(device))


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of `device`."""
    return torch._C._accelerator_getMemoryInfo(_stats_device(device))


# ------------------------------------------------------------- properties


class _DeviceProperties:
    """What torch.openreg.get_device_properties() returns."""

    def __init__(self, index: int, total_memory: int) -> None:
        self.name = "OpenReg simulated device"
        self.index = index
        self.total_memory = total_memory
        self.type = _BACKEND_NAME
        # The units a kernel of the device runs on in parallel: the host's
        # cores, which Inductor's C++ kernels use through OpenMP on the
        # stream's worker (Inductor sizes split reductions by this).
        self.multi_processor_count = os.cpu_count() or 1

    def __repr__(self) -> str:
        return (f"_OpenRegDeviceProperties(name={self.name!r}, index={self.index}, "
                f"total_memory={self.total_memory // 2**20}MB)")


def get_device_properties(device: Any = None) -> _DeviceProperties:
    """Name, index and memory size of `device` (default: current)."""
    index = _resolve_device(device)
    return _DeviceProperties(index, mem_get_info(index)[1])


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


# --------------------------------------------------------------------- amp


def get_amp_supported_dtype() -> list[torch.dtype]:
    """Dtypes torch.autocast("openreg", dtype=...) accepts."""
    return [torch.float16, torch.bfloat16]


# ------------------------------------------------------------ registration


def _claim_privateuse1() -> tuple[torch.Generator, ...]:
    torch.utils.rename_privateuse1_backend(_BACKEND_NAME)
    torch._register_device_module(_BACKEND_NAME, sys.modules[__name__])
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    return tuple(_C._default_generator(i) for i in range(device_count()))


default_generators: tuple[torch.Generator, ...] = _claim_privateuse1()

from .streams import (  # noqa: E402 - after the device type exists
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    set_stream,
    stream,
)
from . import _dynamo  # noqa: E402
from . import distributed  # noqa: E402

distributed.register()

# Last: if torch._dynamo is already imported, this registers the dynamo
# DeviceInterface at once, and it reads the module's full API.
_dynamo.install()
