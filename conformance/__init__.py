"""The conformance suite: pytest modules per contract area, the C++ probe
(``_cxx``) with the GoogleTest contracts, and the contract registry."""
