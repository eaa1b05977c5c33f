"""Streams and events of OpenReg devices (torch.openreg.Stream / Event).

They are torch.Stream / torch.Event objects: everything PyTorch does with
generic streams and events (torch.accelerator.*, ``with stream:``,
record_stream, wait_stream, elapsed_time) works on them. Each stream is
served by its own worker thread in the runtime, so work launched on it
really runs asynchronously; see docs/reference-backend/streams-and-events.md.

Priorities: 0 (the default) and -1 (more urgent). Other values are clamped
into that range, as CUDA does.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _C

__all__ = [
    "Event",
    "Stream",
    "StreamContext",
    "current_stream",
    "default_stream",
    "set_stream",
    "stream",
]


def _index(device: Any) -> int:
    from . import _resolve_device

    return _resolve_device(device)


class Stream(torch.Stream):
    """A stream of an OpenReg device.

    ``Stream(device=None, priority=0)`` takes a stream from the device's pool
    (32 per priority, handed out round robin, like CUDA's pool).
    """

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Stream:
        if kwargs:  # (stream_id, device_index, device_type): wrap an existing stream
            return super().__new__(cls, **kwargs)
        from . import _lazy_init

        _lazy_init()
        return super().__new__(cls, device=torch.device("openreg", _index(device)), priority=priority)

    @property
    def priority(self) -> int:
        return _C._stream_priority(self)

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """(least, greatest) priority: (0, -1)."""
        return (0, -1)

    def record_event(self, event: torch.Event | None = None) -> torch.Event:
        """Record `event` (default: a new torch.openreg.Event) on this stream.
        torch.Stream's own method refuses torch.Event subclasses such as
        torch.openreg.Event."""
        if event is None:
            event = Event(self.device_index)
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"openreg.Stream(device=openreg:{self.device_index}, stream_id={self.stream_id}, priority={self.priority})"


class Event(torch.Event):
    """An event of an OpenReg device (created on first record, like CUDA).

    ``record()`` without a stream records on the current stream of the
    event's device (torch.Event alone would use the current device's).
    ``wait()`` without a stream makes the current stream of the *current*
    device wait, as torch.Event.wait does: that is the consumer's stream,
    possibly on another device.
    """

    def __new__(cls, device: Any = None, *, enable_timing: bool = False, **kwargs: Any) -> Event:
        index = _index(device)
        event = super().__new__(cls, device=torch.device("openreg", index),
                                enable_timing=enable_timing, **kwargs)
        event._openreg_index = index
        return event

    @property
    def device(self) -> torch.device:
        """The event's device, also before its first record (torch.Event
        reports one only once recorded)."""
        return torch.device("openreg", self._openreg_index)

    def record(self, stream: torch.Stream | None = None) -> None:
        if stream is None:
            stream = current_stream(self._openreg_index)
        elif stream.device.type == "openreg" and stream.device_index != self._openreg_index:
            # torch.Event would silently move to the stream's device on its
            # first record: its device is unset until then.
            raise RuntimeError(
                f"OpenReg: an event of device {self._openreg_index} cannot be recorded on a "
                f"stream of device {stream.device_index}")
        super().record(stream)

    def elapsed_time(self, end_event: torch.Event) -> float:
        """Milliseconds between this event and `end_event` (both recorded
        with enable_timing=True and completed). torch.Event's own method
        refuses subclasses such as this one as `end_event`."""
        return _C._event_elapsed_time(self, end_event)


def _wrap(stream: torch.Stream) -> Stream:
    return Stream(stream_id=stream.stream_id, device_index=stream.device_index,
                  device_type=stream.device_type)


def current_stream(device: Any = None) -> Stream:
    """The current stream of `device` in the calling thread."""
    from . import _lazy_init

    _lazy_init()
    return _wrap(torch.accelerator.current_stream(_index(device)))


def default_stream(device: Any = None) -> Stream:
    """The default stream of `device` (never one of the pool's streams)."""
    from . import _lazy_init

    _lazy_init()
    return _wrap(_C._default_stream(_index(device)))


def set_stream(stream: torch.Stream) -> None:
    """Make `stream` current for its device (and its device current)."""
    torch.accelerator.set_stream(stream)


class StreamContext:
    """``with torch.openreg.stream(s):`` makes `s` current, then restores the
    previous device and its stream. ``None`` does nothing."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream

    def __enter__(self) -> torch.Stream | None:
        if self.stream is not None:
            self.stream.__enter__()
        return self.stream

    def __exit__(self, *exc_info: object) -> bool:
        if self.stream is not None:
            self.stream.__exit__(*exc_info)
        return False


def stream(stream: torch.Stream | None) -> StreamContext:
    return StreamContext(stream)
