"""Compliance reports: the result model, and its renderings.

model        the result model (verdicts, contracts, provenance, level rules)
json_report  the canonical JSON document, its schema (schema/) and digest
junit, markdown, html, badge
             renderings of the JSON document (html uses templates/)
writer       writing them all, atomically
diff, verify comparing two reports; checking one against the registry

Nothing here imports pytest or the harness: a report can be rendered, diffed
and verified from its JSON file alone (see docs/reports.md).
"""
