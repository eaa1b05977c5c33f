"""The conformance kit's harness: the pytest plugin (--backend, --level,
--manifest, --expectations, --report-dir), backend resolution, the contract
registry loader, process isolation with crash and hang verdicts, and the
command-line program."""
