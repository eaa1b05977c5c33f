"""The conformance suite: pytest modules per contract area, the C++ probe
(``_cxx``) with the GoogleTest contracts, and the contract registry.

``_cxx`` is compiled against the running torch on first use (see
``_probe.py``): ``from privateuse1_conformance.conformance import _cxx``
loads it, building it first if this torch has no cached build."""


def __getattr__(name: str):
    if name == "_cxx":
        from ._probe import load

        return load()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
