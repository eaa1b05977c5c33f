"""The compliance reports on their own, from synthetic runs (no suite run):
the JSON document, its schema and digest, every rendering (well-formed, and
inert with hostile backend strings), diff and verify, and the HTML page in a
real headless browser where chromium is installed."""

from __future__ import annotations

import copy
import dataclasses
import html.parser
import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from privateuse1_conformance.reports import badge, diff, html as html_report, json_report, junit, markdown, verify
from privateuse1_conformance.reports import writer
from privateuse1_conformance.reports.model import ContractInfo, ContractResult, OperatorCell, OperatorResult, Provenance, Run
from privateuse1_conformance.reports.model import TestResult as ModelTestResult  # not a test class for pytest
from privateuse1_conformance.reports.model import Verdict, level_reached

V = Verdict
OPTIONAL = ["amp"]
# (id, area, level, features, test verdicts, unclaimed features)
CONTRACTS = [
    ("DM-ONE-001", "device-management", "core", [], [V.PASS, V.PASS], []),
    ("DM-TWO-001", "device-management", "core", [], [V.XPASS], []),
    ("HK-ONE-001", "hooks", "core", [], [V.PASS], []),
    ("ST-ONE-001", "streams", "standard", ["streams"], [V.PASS, V.FAIL], []),
    ("ST-TWO-001", "streams", "standard", [], [V.CRASH], []),
    ("EV-ONE-001", "events", "standard", [], [V.HANG], []),
    ("EV-TWO-001", "events", "standard", [], [V.XFAIL], []),
    ("EV-THR-001", "events", "standard", [], [V.ERROR], []),
    ("EV-FOU-001", "events", "standard", [], [V.SKIP], []),
    ("AM-ONE-001", "amp", "full", ["amp"], [V.NOT_CLAIMED], ["amp"]),
    ("AM-TWO-001", "amp", "full", [], [], []),
]

HOSTILE = (
    "<script>alert(1)</script><img src=x onerror=alert(2)> | pipe | `tick` ``` fence ~~~ "
    "[link](javascript:alert(3)) ![img](http://x/y.png) **bold** <!-- c --> </details> </pre> "
    "]]> <![CDATA[ & &amp; \" ' \x00\x01\x07\x1b[31mred\x1b[0m\x7f\x9b \ufffe\uffff \ud800 "
    "\u202eevil\u202c 🚀 ünï \r\nsecond line\n# heading\n---\n| a | b |"
)


def _provenance(**changes) -> Provenance:
    provenance = Provenance(
        kit_version="0.1.0", kit_commit="abc123", torch_version="2.13.0+cpu", torch_build="cpu",
        torch_cxx11_abi=True, python="3.11.7 (CPython)", platform="Linux", backend_requested="fake",
        backend_module="fake_backend", backend_version="1.0", device_type="fake", device_count=2,
        command_line=["privateuse1-conformance", "run", "--backend", "fake"], level_checked="full",
        isolation="fork", timeout_s=60.0, seeds={"hypothesis": "derandomized"},
        manifest={"path": "/m.toml", "sha256": "0" * 64}, expectations=None,
        started="2026-01-01T00:00:00+00:00", duration_s=12.5, backend_name="fake", backend_file="/fake.py",
        torch_git_version="deadbeef", registry={"path": "/contracts.toml", "sha256": "1" * 64},
        packages={"pytest": "9"}, environment={}, working_directory="/tmp",
        selection={"tests": 0, "sha256": "2" * 64, "operators": "default", "narrowed_by": []},
        kit_files={"harness/plugin.py": "3" * 64}, backend_files={"fake_backend.py": "4" * 64},
    )
    return dataclasses.replace(provenance, **changes)


def make_run(contracts=CONTRACTS, text: str = "", complete: bool = True, **provenance) -> Run:
    """A run whose failing tests carry `text` in every backend-derived field."""
    results = []
    for contract_id, area, level, features, verdicts, unclaimed in contracts:
        tests = [
            ModelTestResult(
                nodeid=f"test_{area}.py::test_{contract_id}_{i}{text[:40]}", contracts=[contract_id], verdict=v,
                duration=0.25 * (i + 1),
                message="" if v.satisfies else f"{v.value} in {contract_id}: {text}",
                details="" if v.satisfies else f"Traceback\n{text}\n{text}",
                rerun=f"pytest --backend=fake 'test_{area}.py::test_{contract_id}_{i}{text[:20]}'",
                expectation="known {text}" if v in (V.XFAIL, V.XPASS) else "",
            )
            for i, v in enumerate(verdicts)
        ]
        info = ContractInfo(contract_id, area, level, f"Statement of {contract_id}.", "torch.docs", list(features))
        results.append(ContractResult(info, tests, list(unclaimed),
                                      rerun=f"privateuse1-conformance run --backend=fake --contract={contract_id}"))
    return Run(provenance=_provenance(**provenance), contracts=results, optional_features=OPTIONAL,
               unclaimed_features=["amp"], claimed_level=None, complete=complete,
               uncovered=["AM-TWO-001"] if complete else [], stale_expectations=["DM-TWO-001"],
               operators=make_operators(text))


def make_operators(text: str = "", mul_int32: Verdict = V.FAIL) -> list[OperatorResult]:
    """Three rows of an operator matrix: add passes; mul's int32 cell has
    verdict `mul_int32` (its forward check); conv is not claimed at all."""
    def cell(dtype, **checks):
        return OperatorCell(dtype, {c: v for c, v in checks.items()},
                            {c: f"{c} {v.value} {text}" for c, v in checks.items() if v is not V.PASS})
    return [
        OperatorResult("add", "test_opinfo.py::test_operator[add]",
                       [cell("float32", forward=V.PASS, backward=V.PASS), cell("int32", forward=V.PASS)]),
        OperatorResult(f"mul{text[:30]}", "test_opinfo.py::test_operator[mul]",
                       [cell("float32", forward=V.PASS, out=V.SKIP), cell("int32", forward=mul_int32),
                        cell("any", errors=V.PASS)]),
        OperatorResult("conv", "test_opinfo.py::test_operator[conv]", [cell("all", forward=V.NOT_CLAIMED)]),
    ]


def passing_run(**provenance) -> Run:
    """Every contract satisfied (AM-ONE-001 not claimed, optional)."""
    passing = [(c, a, l, f, [V.NOT_CLAIMED] if u else [V.PASS], u) for c, a, l, f, _, u in CONTRACTS]
    return make_run(passing, **provenance)


def registry_of(run: Run) -> list[ContractInfo]:
    return [r.contract for r in run.contracts]


# --------------------------------------------------------------- JSON document

def test_document_is_schema_valid_and_digest_verifies():
    document = json_report.to_document(make_run())
    assert json_report.schema_problems(document) == []
    assert json_report.digest_problem(document) is None
    summary = document["summary"]
    assert summary["level_reached"] == "core"  # streams and events fail in standard
    assert summary["verdicts"]["no-test"] == 1 and summary["verdicts"]["crash"] == 1
    assert summary["contracts"] == len(CONTRACTS)
    assert summary["test_verdicts"]["pass"] == 4
    by_area = {a["area"]: a for a in summary["areas"]}
    assert by_area["events"]["verdicts"]["hang"] == 1 and by_area["events"]["satisfied"] == 0
    levels = {entry["level"]: entry for entry in summary["levels"]}
    assert levels["core"]["reached"] is True and levels["core"]["blocking"] == []
    assert "ST-TWO-001" in levels["standard"]["blocking"]
    contract = next(c for c in document["contracts"] if c["id"] == "ST-ONE-001")
    assert contract["verdict"] == "fail" and contract["message"].startswith("fail in ST-ONE-001")
    assert contract["duration_ms"] == 250 + 500 and contract["rerun"].endswith("--contract=ST-ONE-001")


def test_core_only_results_reach_core():
    # Level reached is the highest whose contracts (and those below) all hold.
    document = json_report.to_document(make_run([c for c in CONTRACTS if c[2] == "core"]))
    assert document["summary"]["level_reached"] == "core"


def test_level_is_not_reached_when_none_of_its_contracts_was_checked():
    core_only = [ContractResult(ContractInfo("DM-A-001", "a", "core", "s", "src"), [ModelTestResult("t", [], V.PASS)])]
    assert level_reached(core_only, set()) == "core"  # not standard nor full: they were not checked


def test_canonical_form_and_digest_definition():
    document = json_report.to_document(make_run(text="ü 🚀"))
    body = {k: v for k, v in document.items() if k != "digest"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    assert json_report.canonical_bytes(document) == canonical
    import hashlib

    assert document["digest"] == {"algorithm": "sha256", "value": hashlib.sha256(canonical).hexdigest()}
    # The layout of the file does not matter; any change of content does.
    reread = json.loads(json_report.dumps(document))
    assert json_report.digest_problem(reread) is None
    assert json_report.digest_problem(json.loads(json_report.dumps(document, indent=None))) is None
    reread["contracts"][0]["tests"][0]["duration_ms"] += 1
    assert "digest mismatch" in json_report.digest_problem(reread)
    assert not any(isinstance(v, float) for v in _leaves(document)), "floats would make the digest library-dependent"


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def test_document_round_trips_through_the_model():
    document = json_report.to_document(make_run(text=HOSTILE))
    assert json_report.to_document(json_report.from_document(document)) == document


def test_lone_surrogates_do_not_make_the_report_unwritable(tmp_path):
    document = json_report.to_document(make_run(text="bad \ud800 byte"))
    path = writer.write_json(tmp_path, document)
    reread = json_report.load(path)
    assert "bad \ufffd byte" in reread["contracts"][3]["message"]
    assert json_report.digest_problem(reread) is None


def test_write_all_writes_every_format_readable_by_others(tmp_path):
    written = writer.write_all(tmp_path, make_run())
    assert set(written) == {"json", "junit", "markdown", "html", "badge"}
    for path in written.values():
        assert path.stat().st_size > 0
        assert path.stat().st_mode & 0o044, f"{path.name} should be readable by others (umask permitting)"
    assert not list(tmp_path.glob(".*.tmp")), "temporary files must not be left behind"
    writer.remove_renderings(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def _interrupt_at_line(k: int):
    """A trace function that raises KeyboardInterrupt (what SIGINT raises) at
    the k-th line atomic_write's own frame runs, once."""
    seen = {"lines": 0, "fired": False}

    def local(frame, event, arg):
        if event == "line" and not seen["fired"]:
            seen["lines"] += 1
            if seen["lines"] == k:
                seen["fired"] = True
                raise KeyboardInterrupt
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code is writer.atomic_write.__code__ else None

    return tracer, seen


def test_an_interrupt_anywhere_in_a_write_goes_through_and_leaves_old_or_new(tmp_path, monkeypatch):
    """SIGINT at every line of atomic_write, and just after the rename: the
    KeyboardInterrupt reaches the caller (never a FileNotFoundError from the
    cleanup in its place), the file holds the old text or the new one, and
    no temporary file is left."""
    import sys

    path = tmp_path / "report.json"
    fired = 0
    for k in range(1, 100):
        path.write_text("old")
        tracer, seen = _interrupt_at_line(k)
        sys.settrace(tracer)
        try:
            writer.atomic_write(path, "new")
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        assert path.read_text() in ("old", "new"), k
        assert not list(tmp_path.glob(".*.tmp")), f"a temporary file was left by an interrupt at line {k}"
        if not seen["fired"]:
            break  # every line was interrupted once
        fired += 1
    assert fired >= 5, "the trace should have interrupted every line of atomic_write"

    real_replace = writer.os.replace

    def replace_then_interrupt(src, dst):
        real_replace(src, dst)
        raise KeyboardInterrupt

    monkeypatch.setattr(writer.os, "replace", replace_then_interrupt)
    path.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        writer.atomic_write(path, "new")
    assert path.read_text() == "new"
    assert not list(tmp_path.glob(".*.tmp"))


# --------------------------------------------------------------- renderings

class _TagCollector(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[str] = []
        self._in_script = False
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        (self.scripts if self._in_script else self.text).append(data)


def _our_script() -> str:
    return (html_report.TEMPLATES / "report.js").read_text()


def test_renderings_keep_hostile_backend_strings_inert():
    run = make_run(text=HOSTILE, backend_name=HOSTILE[:80], backend_version=HOSTILE, backend_module=HOSTILE,
                   warnings=[HOSTILE])
    document = json_report.to_document(run)
    assert json_report.schema_problems(document) == []

    # JUnit: well-formed XML, every test present, the text kept as text.
    root = ET.fromstring(junit.render(document).encode("utf-8"))
    cases = root.findall(".//testcase")
    assert len(cases) == sum(max(len(c[4]), 1) for c in CONTRACTS)
    failure = root.find(".//failure")
    assert "<script>alert(1)</script>" in failure.get("message") and "]]>" in failure.text
    assert "\x1b" not in failure.text and "\\x1b[31mred" in failure.text
    assert "\u202e" not in failure.text and "\\u202eevil" in failure.text, "bidi overrides are shown, not applied"

    # Badge: well-formed SVG with nothing but the shapes and text we draw.
    svg = ET.fromstring(badge.render(document).encode("utf-8"))
    assert {element.tag.split("}")[1] for element in svg.iter()} <= {"svg", "title", "clipPath", "rect", "g", "text"}
    assert not [name for element in svg.iter() for name in element.attrib if name.lower().startswith("on")]

    # HTML: the only script is the page's own, no injected element or event handler.
    page = html_report.render(document)
    parser = _TagCollector()
    parser.feed(page)
    tag_names = [tag for tag, _ in parser.tags]
    assert tag_names.count("script") == 1 and parser.scripts == [_our_script()]
    assert "img" not in tag_names
    # The only links are the ones the page makes to PyTorch's sources and docs.
    assert all(attrs.get("href", "").startswith("https://github.com/pytorch/pytorch/blob/")
               for tag, attrs in parser.tags if tag == "a"), [a for t, a in parser.tags if t == "a"]
    assert not [name for _, attrs in parser.tags for name in attrs if name.startswith("on")]
    text = "".join(parser.text)
    assert "<script>alert(1)</script>" in text, "hostile markup must be shown as text"
    assert not re.search("[\x00\x1b\ufffe\u202e]", page)

    # Markdown: tables keep their columns, no raw HTML or link from the backend, fences hold.
    _check_markdown(markdown.render(document))
    _check_markdown(diff.format_markdown(diff.diff(json_report.to_document(make_run()), document)))

    # Plain-text outputs (terminal): no control characters.
    for text_output in (diff.format_text(diff.diff(json_report.to_document(make_run()), document)),
                        verify.format_text(verify.verify(document, registry_of(run), set(OPTIONAL)))):
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f]", text_output)


_OWN_TAGS = re.compile(r"</?(details|summary)>")


def _check_markdown(text: str) -> None:
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f\u202e]", text)
    outside = []
    fence = None
    for line in text.split("\n"):
        match = re.match(r"^(`{3,})", line)
        if fence is None and match:
            fence = match.group(1)
            continue
        if fence is not None:
            if line == fence:
                fence = None
            continue
        outside.append(line)
    assert fence is None, "a fenced block was left open"
    # Our own links: the sources of contracts, to PyTorch's repository.
    prose = re.sub(r"\]\(https://github\.com/pytorch/pytorch/blob/[\w.]+/[\w./-]+\)", "]", "\n".join(outside))
    for raw in ("<script", "<img", "<!--", "](", "![", "**bold**", "`tick`"):
        assert not re.search(r"(?<!\\)" + re.escape(raw), _OWN_TAGS.sub("", prose)), \
            f"unescaped {raw!r} in Markdown prose"
    assert "</details>" not in prose.replace("\n</details>", "")  # only our own closing tags, on their own line
    header_cells = None
    for line in outside:
        if line.startswith("|"):
            cells = len(re.findall(r"(?<!\\)\|", line))
            if header_cells is None:
                header_cells = cells
            assert cells == header_cells, f"a table row has extra columns: {line[:200]}"
        else:
            header_cells = None


def test_junit_counts_and_verdict_mapping():
    root = ET.fromstring(junit.render(json_report.to_document(make_run())).encode("utf-8"))
    assert root.get("tests") == str(sum(max(len(c[4]), 1) for c in CONTRACTS))
    assert root.get("failures") == "1" and root.get("errors") == "3"  # fail; crash, hang, error
    assert root.get("skipped") == "4"  # xfail, skip, not-claimed, the contract without a test
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert list(suites) == ["device-management", "hooks", "streams", "events", "amp"]
    assert suites["device-management"].find("properties") is not None
    crash = next(c for c in root.iter("testcase") if "ST-TWO-001" in c.get("classname"))
    assert crash.find("error").get("type") == "crash"
    assert crash.get("classname") == "streams.ST-TWO-001"


def _shared_cause_run() -> Run:
    """One test checking two contracts, its failure charged to the second;
    two more tests failing on the same underlying error."""
    run = make_run()
    cause = "NotImplementedError: no kernel for aten::foo"
    first, second = run.contracts[0], run.contracts[2]  # DM-ONE-001 (passes alone), HK-ONE-001
    both = ModelTestResult(nodeid="test_x.py::test_both", contracts=["DM-ONE-001", "HK-ONE-001"], verdict=V.FAIL,
                           message="the hooks disagree", verdicts={"DM-ONE-001": V.INCONCLUSIVE},
                           messages={"DM-ONE-001": "stopped before its checks"}, cause=cause)
    first.tests.append(both)
    second.tests.append(both)
    second.tests.append(ModelTestResult(nodeid="test_x.py::test_other", contracts=["HK-ONE-001"], verdict=V.ERROR,
                                        message="raised", cause=cause))
    return run


def test_shared_root_causes_reach_every_rendering():
    document = json_report.to_document(_shared_cause_run())
    [group] = [g for g in document["summary"]["root_causes"] if "aten::foo" in g["cause"]]
    assert group["tests"] == ["test_x.py::test_both", "test_x.py::test_other"]
    assert group["contracts"] == ["HK-ONE-001"] and group["verdict"] == "fail"  # the worst of fail, error
    text = markdown.render(document)
    assert "Shared root causes" in text and markdown.escape("aten::foo") in text
    page = html_report.render(document)
    assert 'id="root-causes"' in page and "aten::foo" in page


def test_junit_shows_a_multi_contract_test_once_with_its_worst_verdict():
    root = ET.fromstring(junit.render(json_report.to_document(_shared_cause_run())).encode("utf-8"))
    [case] = [c for c in root.iter("testcase") if c.get("name") == "test_x.py::test_both"]
    failure = case.find("failure")
    assert failure is not None, "the failure charged to the second contract must not be hidden by the first"
    assert failure.get("message").startswith("fail: [HK-ONE-001] the hooks disagree")
    assert case.get("classname") == "device-management.DM-ONE-001+HK-ONE-001"


def test_markdown_fits_a_pull_request_comment():
    many = [(f"DM-X{i:03d}-001", "device-management", "core", [], [V.FAIL], []) for i in range(400)]
    text = markdown.render(json_report.to_document(make_run(many, text="x" * 3000)))
    assert len(text) <= markdown.BUDGET
    assert "more: see report.html" in text
    _check_markdown(text)


def test_badge_shows_name_module_level_optional_features_and_percentage():
    document = json_report.to_document(passing_run())
    svg = badge.render(document)
    # The manifest's name and the module; amp, the one optional feature, is not claimed.
    assert "fake (fake_backend): full · 0/1 optional · 100%" in svg and badge.COLOURS["full"] in svg
    incomplete = json_report.to_document(make_run(complete=False))
    assert "incomplete" in badge.render(incomplete) and badge.INCOMPLETE in badge.render(incomplete)
    # 3 of the 10 claimed contracts satisfied (the not-claimed AM-ONE-001 does not count): 30 %.
    assert "core · 0/1 optional · 30%" in badge.render(json_report.to_document(make_run()))


def test_html_page_needs_no_network():
    page = html_report.render(json_report.to_document(make_run()))
    parser = _TagCollector()
    parser.feed(page)
    csp = next(attrs["content"] for tag, attrs in parser.tags
               if tag == "meta" and attrs.get("http-equiv") == "Content-Security-Policy")
    assert "default-src 'none'" in csp
    for tag, attrs in parser.tags:
        for name in ("src", "href"):
            if tag == "a" and name == "href":  # a link to a contract's source loads nothing until followed
                assert attrs[name].startswith("https://"), attrs
                continue
            assert name not in attrs, f"<{tag} {name}=...> would load something"


def test_html_links_each_contracts_sources():
    """As report.md does: the PyTorch files a contract's source names, linked
    at the tag of the run's torch."""
    document = json_report.to_document(make_run())
    failing = next(c for c in document["contracts"] if not c["satisfied"])
    failing["source"] = "docs/source/accelerator/device.md (validate inputs); <b>x</b>"
    page = html_report.render(document)
    release = "v" + document["provenance"]["torch_version"].split("+")[0]
    assert (f'· <a href="https://github.com/pytorch/pytorch/blob/{release}/docs/source/accelerator/device.md">'
            "docs/source/accelerator/device.md</a>") in page, page[:2000]
    assert "&lt;b&gt;x&lt;/b&gt;" in page  # the rest escaped


# --------------------------------------------------------------- diff

def test_diff_classifies_changes():
    old = json_report.to_document(passing_run())
    new_contracts = [c for c in CONTRACTS if c[0] != "DM-ONE-001"]
    new_contracts.append(("GD-NEW-001", "guard", "core", [], [V.PASS], []))
    new = json_report.to_document(make_run(new_contracts))
    result = diff.diff(old, new)
    assert {c.id for c in result.regressions} == {"ST-ONE-001", "ST-TWO-001", "EV-ONE-001", "EV-TWO-001",
                                                 "EV-THR-001", "EV-FOU-001", "AM-TWO-001"}
    assert [c.id for c in result.removed] == ["DM-ONE-001"] and [c.id for c in result.added] == ["GD-NEW-001"]
    assert [c.id for c in result.changed] == ["DM-TWO-001"]  # pass -> xpass: still satisfied
    st_one = next(c for c in result.regressions if c.id == "ST-ONE-001")
    assert [(t.old, t.new) for t in st_one.tests] == [(None, "fail")]
    assert result.old_level == "full" and result.new_level == "core" and result.level_dropped and result.regressed
    reverse = diff.diff(new, old)
    assert len(reverse.fixes) == 7 and not reverse.regressions and not reverse.regressed
    # Unsatisfied both times, but worse: still a regression.
    failing = [("ST-TWO-001", "streams", "standard", [], [V.FAIL], [])]
    crashing = [("ST-TWO-001", "streams", "standard", [], [V.CRASH], [])]
    worse = diff.diff(json_report.to_document(make_run(failing)), json_report.to_document(make_run(crashing)))
    assert [c.id for c in worse.regressions] == ["ST-TWO-001"]
    same = diff.diff(old, old)
    assert not same.regressed and "no regression" in diff.format_text(same)
    assert json.loads(diff.format_json(result))["regressed"] is True


# --------------------------------------------------------------- verify

def _verify(document, run=None, level=None):
    run = run or passing_run()
    return verify.verify(document, registry_of(run), set(OPTIONAL), level)


def test_verify_accepts_a_passing_complete_report():
    result = _verify(json_report.to_document(passing_run()))
    assert result.ok, result.problems
    assert result.level == "full"


def test_verify_rejects_an_edit_and_a_resealed_inconsistent_edit():
    document = json_report.to_document(passing_run())
    edited = copy.deepcopy(document)
    edited["contracts"][0]["verdict"] = "fail"
    assert any("digest mismatch" in p for p in _verify(edited).problems)
    # Re-sealed, the edit is still inconsistent with the test results it summarizes.
    json_report.seal(edited)
    problems = _verify(edited).problems
    assert problems and all("inconsistent" in p for p in problems), problems
    forged = copy.deepcopy(document)
    forged["summary"]["level_reached"] = "full"
    forged["contracts"][3]["tests"][0]["verdict"] = "fail"
    json_report.seal(forged)
    assert any("inconsistent: /summary" in p for p in _verify(forged).problems)


def test_verify_checks_every_mandatory_contract_of_the_level():
    run = passing_run()
    # Fully consistent (re-rendered) report with one mandatory contract failing.
    failing = json_report.from_document(json_report.to_document(run))
    failing.contracts[3].tests[0].verdict = V.FAIL
    document = json_report.to_document(failing)
    assert _verify(document, run, "core").ok
    problems = _verify(document, run, "standard").problems
    assert len(problems) == 1 and problems[0].startswith(
        "ST-ONE-001 (standard): verdict fail does not satisfy level standard"), problems
    # Missing and duplicated contracts.
    missing = json_report.from_document(json_report.to_document(run))
    duplicate = missing.contracts[0]
    del missing.contracts[2]
    missing.contracts.append(duplicate)
    problems = _verify(json_report.to_document(missing), run, "core").problems
    assert "HK-ONE-001 (core): missing from the report" in problems
    assert "DM-ONE-001: present 2 times" in problems
    # An unknown contract.
    extra = json_report.from_document(json_report.to_document(run))
    extra.contracts.append(ContractResult(ContractInfo("ZZ-NEW-001", "x", "core", "s", "src"),
                                          [ModelTestResult("t", ["ZZ-NEW-001"], V.PASS)]))
    assert "ZZ-NEW-001: not an active contract of the kit's registry" in _verify(json_report.to_document(extra), run).problems


def test_verify_honours_optional_features_only():
    run = passing_run()
    assert _verify(json_report.to_document(run), run, "full").ok  # amp is optional
    registry = registry_of(run)
    problems = verify.verify(json_report.to_document(run), registry, set(), "full").problems
    assert problems == ["AM-ONE-001 (full): verdict not-claimed does not satisfy level full "
                        "(the feature amp is not optional for the level)"]
    # Not-claimed with no unclaimed feature recorded: said so, not "features  are not optional".
    bare = [(c, a, l, f, [V.NOT_CLAIMED] if c == "DM-ONE-001" else v, u)
            for c, a, l, f, v, u in [(c, a, l, f, [V.NOT_CLAIMED] if u else [V.PASS], u)
                                     for c, a, l, f, _, u in CONTRACTS]]
    [problem] = _verify(json_report.to_document(make_run(bare)), run, "core").problems
    assert problem.startswith("DM-ONE-001 (core): verdict not-claimed does not satisfy level core (its tests")
    assert "features  are" not in problem
    # Not claiming a feature the contract does not need is a forgery.
    forged = [(c, a, l, f, [V.NOT_CLAIMED], ["amp"]) if c == "DM-ONE-001" else (c, a, l, f, v, u)
              for c, a, l, f, v, u in [(c, a, l, f, [V.NOT_CLAIMED] if u else [V.PASS], u)
                                       for c, a, l, f, _, u in CONTRACTS]]
    problems = _verify(json_report.to_document(make_run(forged)), run, "core").problems
    assert problems == ["DM-ONE-001: not-claimed for features it does not need: amp"]


def test_verify_requires_complete_run_and_provenance():
    problems = _verify(json_report.to_document(make_run(complete=False, backend_version=None, kit_version="")),
                       level="core").problems
    assert "the run is incomplete (interrupted or crashed): complete is false" in problems
    assert "provenance: backend_version is missing or empty" in problems
    assert "provenance: kit_version is missing or empty" in problems
    core_failing = [(c, a, l, f, [V.FAIL], u) for c, a, l, f, _, u in CONTRACTS]
    nothing = _verify(json_report.to_document(make_run(core_failing))).problems
    assert any("claims no level and reaches none" in p for p in nothing)
    assert any("checked contracts up to core only" in p
               for p in _verify(json_report.to_document(passing_run(level_checked="core")), level="full").problems)
    broken = json_report.to_document(passing_run())
    del broken["provenance"]
    assert _verify(broken).problems[0].startswith("schema: (document): 'provenance' is a required property")


NARROWED = {"tests": 3, "sha256": "5" * 64, "operators": "default", "narrowed_by": ["-k 'not test_x'"]}


def test_a_narrowed_run_certifies_nothing_anywhere():
    """A run that selected part of the suite reaches no level, whatever its
    verdicts, says so in every rendering, and does not verify for any level."""
    run = passing_run(selection=NARROWED)
    assert [r.verdict for r in run.contracts] == [r.verdict for r in passing_run().contracts]
    document = json_report.to_document(run)
    assert document["summary"]["level_reached"] is None and document["summary"]["certifies"] is False
    for level in ("core", "standard", "full"):
        problems = _verify(document, level=level).problems
        assert any("the run was narrowed (-k 'not test_x')" in p for p in problems), problems
    assert "narrowed run: certifies nothing" in text_title(document)
    assert "narrowed" in badge.render(document) and badge.INCOMPLETE in badge.render(document)
    assert "Narrowed run: it certifies nothing" in markdown.render(document)
    assert 'id="narrowed"' in html_report.render(document)


def test_a_shard_or_a_run_cut_short_certifies_nothing():
    """A shard certifies only once merged with the others; a run cut short
    (interrupted, -x) reaches no level: its tests that did not run decide
    nothing."""
    assert json_report.to_document(passing_run())["summary"]["certifies"] is True
    shard = json_report.to_document(passing_run(shard={"index": 1, "count": 2}))
    assert shard["summary"]["certifies"] is False
    passing = [(c, a, l, f, [V.NOT_CLAIMED] if u else [V.PASS], u) for c, a, l, f, _, u in CONTRACTS]
    cut_short = json_report.to_document(make_run(passing, complete=False))
    assert cut_short["summary"]["level_reached"] is None and cut_short["summary"]["certifies"] is False


def text_title(document):
    from privateuse1_conformance.reports.text import title
    return title(document)


def test_verify_requires_every_test_function_of_the_kits_suite():
    run = passing_run()
    document = json_report.to_document(run)
    functions = {t.nodeid.partition("[")[0]: "core" for r in run.contracts for t in r.tests}
    kit = verify.KitFacts(tests=functions)
    assert verify.verify(document, registry_of(run), set(OPTIONAL), "full", kit=kit).ok
    kit.tests["test_streams.py::test_the_one_that_was_dropped"] = "standard"
    problems = verify.verify(document, registry_of(run), set(OPTIONAL), "full", kit=kit).problems
    assert problems == ["1 test(s) of this kit's suite up to full are not in the report: "
                        "test_streams.py::test_the_one_that_was_dropped"]
    assert verify.verify(document, registry_of(run), set(OPTIONAL), "core", kit=kit).ok  # (a standard test)


def test_verify_treats_untrusted_provenance_as_problems():
    run = passing_run(torch_version="2.99.0", isolation="none", kit_commit="abc123-dirty",
                      command_line=["privateuse1-conformance", "run", "--backend", "fake", "--allow-untested-torch"])
    kit = verify.KitFacts(version="0.2.0", registry_sha256="9" * 64, files={"harness/plugin.py": "8" * 64},
                          torch_problem=lambda v: None if v.startswith("2.13") else f"torch {v} is not supported",
                          backend_module="fake_backend", backend_files={"fake_backend.py": "7" * 64})
    problems = verify.verify(json_report.to_document(run), registry_of(run), set(OPTIONAL), "full", kit=kit).problems
    expected = ["torch: torch 2.99.0 is not supported", "--allow-untested-torch", "isolation 'none'",
                "the run used kit 0.1.0, this is kit 0.2.0", "modified checkout (abc123-dirty)",
                "another contract registry", "the kit that ran differs from this kit in 1 file(s): harness/plugin.py",
                "the backend's files differ from those installed here in 1 file(s): fake_backend.py"]
    for text in expected:
        assert any(text in p for p in problems), (text, problems)
    same = verify.KitFacts(version="0.1.0", registry_sha256="1" * 64, files={"harness/plugin.py": "3" * 64},
                           torch_problem=lambda v: None, backend_module="fake_backend",
                           backend_files={"fake_backend.py": "4" * 64})
    result = verify.verify(json_report.to_document(passing_run()), registry_of(run), set(OPTIONAL), "full", kit=same)
    assert result.ok, result.problems
    assert "the backend's 1 files are those installed here" in result.notes
    unidentified = passing_run(kit_version="unknown", kit_files={})
    assert any("unidentifiable" in p for p in verify.verify(
        json_report.to_document(unidentified), registry_of(run), set(OPTIONAL), "full").problems)


def test_verify_refuses_reports_of_older_formats():
    document = json_report.to_document(passing_run())
    document["format_version"] = 4
    assert _verify(document).problems[0].startswith("schema") or "format 4" in _verify(document).problems[0]


def test_a_level_needs_one_of_its_required_optional_features():
    """full means fork safety and AMP or torch.compile: with every one of the
    level's required features unclaimed, the level is not reached, and the
    report says how many optional features were claimed."""
    run = dataclasses.replace(passing_run(), level_requirements={"full": ["amp"]})
    document = json_report.to_document(run)
    assert document["summary"]["level_reached"] == "standard"
    assert document["summary"]["claimed_optional_features"] == []
    assert "standard · 0/1 optional features" in text_title(document)
    problems = verify.verify(document, registry_of(run), set(OPTIONAL), "full").problems
    assert "level full needs at least one of the optional features amp claimed; the backend claims none of them" \
        in problems
    claimed = dataclasses.replace(run, unclaimed_features=[])
    assert model_level(claimed) == "full"


def model_level(run):
    return run.level_reached


def test_a_contract_pass_needs_every_clause_decided():
    info = ContractInfo("DM-ONE-001", "device-management", "core", "S.", "src", [], ["DM-ONE-001.1", "DM-ONE-001.2"])
    decided = ModelTestResult("t1", ["DM-ONE-001"], V.PASS, clauses={"DM-ONE-001.1": "decided"})
    result = ContractResult(info, [decided])
    assert result.verdict is V.INCONCLUSIVE and result.tests_verdict is V.PASS
    assert result.clause_status()["DM-ONE-001.2"].startswith("undecided")
    other = ModelTestResult("t2", ["DM-ONE-001"], V.PASS, clauses={"DM-ONE-001.2": "n/a: needs two devices"})
    assert ContractResult(info, [decided, other]).verdict is V.PASS
    vacuous = ModelTestResult("t3", ["DM-ONE-001"], V.PASS, clauses={"DM-ONE-001.2": "undecided: no overlap"})
    assert ContractResult(info, [decided, vacuous]).verdict is V.INCONCLUSIVE
    both = ModelTestResult("t4", ["DM-ONE-001"], V.PASS, clauses={"DM-ONE-001.2": "decided"})
    assert ContractResult(info, [decided, vacuous, both]).verdict is V.PASS
    # A check that could not observe outranks another test's "does not apply"
    # (which may come from a test that only mentions the clause).
    assert ContractResult(info, [decided, other, vacuous]).verdict is V.INCONCLUSIVE
    assert ContractResult(info, [decided, vacuous, other]).clause_status()["DM-ONE-001.2"] == "undecided: no overlap"
    failing = ModelTestResult("t5", ["DM-ONE-001"], V.FAIL)
    assert ContractResult(info, [decided, failing]).verdict is V.FAIL


# --------------------------------------------------------------- the page in a browser

CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)


def _dump_dom(url: str, profile: Path) -> str:
    """The DOM after the page's script ran (a private profile: tests may run in parallel)."""
    result = subprocess.run(
        [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--disable-extensions",
         f"--user-data-dir={profile}", "--virtual-time-budget=2000", "--dump-dom", url],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


class _RowCollector(html.parser.HTMLParser):
    """The contract rows of the dumped DOM: (verdict, hidden?)."""

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[str, bool]] = []
        self.failures: list[tuple[str, bool]] = []  # the unsatisfied contracts' list above the table
        self.by_id: dict[str, str] = {}
        self._id = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tbody" and "contract" in (attrs.get("class") or "").split():
            self.rows.append((attrs["data-verdict"], "hidden" in attrs))
        if tag == "div" and "failure" in (attrs.get("class") or "").split():
            self.failures.append((attrs["data-verdict"], "hidden" in attrs))
        self._id = attrs.get("id")

    def handle_endtag(self, tag):
        self._id = None

    def handle_data(self, data):
        if self._id:
            self.by_id[self._id] = self.by_id.get(self._id, "") + data


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_html_page_in_a_headless_browser(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(html_report.render(json_report.to_document(make_run(text=HOSTILE))), encoding="utf-8")

    unfiltered = _RowCollector()
    unfiltered.feed(_dump_dom(page.as_uri(), tmp_path / "profile"))
    assert len(unfiltered.rows) == len(CONTRACTS) and not any(hidden for _, hidden in unfiltered.rows)
    assert unfiltered.by_id["level-reached"].strip() == "core"
    assert unfiltered.by_id["satisfied"] == "3 of 10 claimed contracts satisfied (30%)"
    assert unfiltered.by_id["shown-count"] == f"Showing {len(CONTRACTS)} of {len(CONTRACTS)} contracts", \
        "the page's script did not run"

    filtered = _RowCollector()
    filtered.feed(_dump_dom(page.as_uri() + "#verdict=fail", tmp_path / "profile"))
    visible = [verdict for verdict, hidden in filtered.rows if not hidden]
    assert visible == ["fail"], filtered.rows
    assert filtered.by_id["shown-count"] == f"Showing 1 of {len(CONTRACTS)} contracts"

    failures = _RowCollector()
    failures.feed(_dump_dom(page.as_uri() + "#verdict=failures", tmp_path / "profile"))
    assert sorted(v for v, hidden in failures.rows if not hidden) == ["crash", "error", "fail", "hang"]
    # The list of unsatisfied contracts above the table follows the filter too.
    crashes = _RowCollector()
    crashes.feed(_dump_dom(page.as_uri() + "#verdict=crash", tmp_path / "profile"))
    assert [v for v, hidden in crashes.failures if not hidden] == ["crash"], crashes.failures
    assert len(crashes.failures) > 1


def test_html_puts_the_shared_root_causes_before_the_unsatisfied_contracts():
    page = html_report.render(json_report.to_document(_shared_cause_run()))
    assert 'id="root-causes"' in page and page.index('id="root-causes"') < page.index('id="failures"')


# ------------------------------------------------- Markdown, as rendered

MARKDOWN_HOSTILE = ("<script>alert(1)</script> **bold** _em_ [link](http://evil.example) ![img](x.png) | cell | "
           "$x^2$ ~~gone~~ `tick` &amp; <b>raw</b>")


def _rendered(text: str):
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark").enable("table").enable("strikethrough")
    return md, md.parse(text)


def _walk(tokens):
    for token in tokens:
        yield token
        yield from _walk(token.children or [])


def test_markdown_renders_cleanly_with_a_commonmark_renderer():
    """Hostile backend text in every field renders as text: no links but our
    sources', no images, no HTML but our <details>, no emphasis or math, and
    every table row has its header's columns."""
    document = json_report.to_document(make_run(text=MARKDOWN_HOSTILE))
    for contract in document["contracts"]:
        contract["source"] = "docs/source/accelerator/device.md; " + MARKDOWN_HOSTILE
    text = markdown.render(document)
    md, tokens = _rendered(text)
    assert "image" not in {t.type for t in _walk(tokens)}
    links = [t.attrGet("href") for t in _walk(tokens) if t.type == "link_open"]
    assert links and all(h.startswith("https://github.com/pytorch/pytorch/blob/") for h in links), links
    html_bits = {t.content.strip() for t in _walk(tokens) if t.type in ("html_inline", "html_block")}
    allowed = re.compile(r"^(<details><summary>[^<]*</summary>|</details>)$")
    assert all(allowed.match(bit) for bit in html_bits), html_bits
    widths, current = [], None
    for token in tokens:
        if token.type == "tr_open":
            current = 0
        elif token.type in ("th_open", "td_open"):
            current += 1
        elif token.type == "tr_close":
            widths.append(current)
        elif token.type == "table_close":
            assert len(set(widths)) == 1, f"table rows of different widths {widths}"
            widths = []
    rendered = md.render(text)
    assert "<script>" not in rendered and "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered
    assert "**bold**" in rendered and "$x^2$" in rendered and "| cell |" in rendered and "~~gone~~" in rendered
    for applied in ("<strong>bold</strong>", "<em>em</em>", "<s>gone</s>", "<b>raw</b>", "<code>tick</code>"):
        assert applied not in rendered, f"backend text became markup: {applied}"


def test_markdown_escapes_only_what_markdown_needs():
    for plain in ("openreg: no level 47%", "DM-ACC-001", "torch 2.13.0+cpu (a, b); x/y = z?", "a - b"):
        assert markdown.escape(plain) == plain
    assert markdown.escape("1. first") == "1\\. first" and markdown.escape("# title") == "\\# title"
    assert markdown.escape("a|b") == "a\\|b" and markdown.escape("<b>") == "\\<b\\>"
    # Underscores inside a word cannot make emphasis; others can.
    assert markdown.escape("pu1_sync") == "pu1_sync" and markdown.escape("_x_ y_") == "\\_x\\_ y\\_"
    # After other text on the line, '2.' starts no list: as written.
    assert markdown.escape("2.13.0+cpu", inline=True) == "2.13.0+cpu"
    assert markdown.escape("2.13.0+cpu") == "2\\.13.0+cpu"
    document = json_report.to_document(make_run(backend_name="pu1_sync", torch_version="2.13.0+cpu"))
    text = markdown.render(document)
    assert "pu1_sync" in text and "torch 2.13.0+cpu;" in text, text[:600]


def test_markdown_never_cuts_an_id_and_shortens_each_detail_before_dropping_any():
    """Many failures with long details: every failure keeps a shortened
    detail, no ID is cut, and the text fits the budget."""
    many = [(f"DM-X{i:03d}-001", "device-management", "core", [], [V.FAIL], []) for i in range(60)]
    document = json_report.to_document(make_run(many, text="y" * 4000))
    text = markdown.render(document)
    assert len(text) <= markdown.BUDGET
    assert text.count("<details><summary>fail:") == 60, "a per-test detail was dropped while others were kept"
    ids = set(re.findall(r"DM-X\d{3}-\d{3}", text))
    assert len(ids) == 60
    assert not re.search(r"DM-X\d{0,3}-?\d{0,2}\u2026", text), "an ID was cut"
    assert "and 48 more" in text  # the level table lists 12 whole IDs and counts the rest


def test_markdown_shows_each_failures_statement_and_source_with_a_link():
    document = json_report.to_document(make_run())
    failing = [c for c in document["contracts"] if not c["satisfied"]]
    for contract in failing:
        contract["source"] = "docs/source/notes/cuda.rst (streams); c10/core/DeviceGuard.h"
    text = markdown.render(document)
    for contract in failing:
        assert f"Statement of {contract['id']}." in text
    version = document["provenance"]["torch_version"]
    assert "Source: docs/source/notes/cuda.rst (streams); c10/core/DeviceGuard.h" in text
    assert "(https://github.com/pytorch/pytorch/blob/" in text and "/c10/core/DeviceGuard.h)" in text, version


def test_junit_and_html_show_each_failures_statement_and_source():
    document = json_report.to_document(make_run())
    root = ET.fromstring(junit.render(document).encode("utf-8"))
    failures = [c.find("failure") for c in root.iter("testcase") if c.find("failure") is not None]
    assert failures
    for failure in failures:
        assert "Statement of " in failure.text and "Source: torch.docs" in failure.text
    page = html_report.render(document)
    assert page.count("source: torch.docs") == len([c for c in document["contracts"] if not c["satisfied"]])


# --------------------------------------------------------------- operator matrix

def test_operator_matrix_in_the_document():
    document = json_report.to_document(make_run())
    assert json_report.schema_problems(document) == []
    by_name = {o["name"]: o for o in document["operators"]}
    assert by_name["add"]["verdict"] == "pass" and by_name["add"]["claimed"]
    mul = by_name["mul"]
    # A cell is its worst check that is evidence (a skipped check is none).
    assert [c["verdict"] for c in mul["cells"]] == ["pass", "fail", "pass"] and mul["verdict"] == "fail"
    assert mul["cells"][1]["messages"] == {"forward": "forward fail "}
    assert by_name["conv"]["verdict"] == "not-claimed" and not by_name["conv"]["claimed"]
    counts = document["summary"]["operators"]
    assert (counts["operators"], counts["claimed"]) == (3, 2)
    assert counts["verdicts"]["fail"] == 1 and counts["cells"]["pass"] == 4 and counts["cells"]["fail"] == 1


def test_verify_catches_a_forged_operator_cell():
    run = passing_run()
    document = json_report.to_document(run)
    assert _verify(document, run).ok
    forged = copy.deepcopy(document)
    forged["operators"][1]["cells"][1]["verdict"] = "pass"   # the int32 mul cell, its check still failing
    forged["operators"][1]["verdict"] = "pass"
    forged["summary"]["operators"]["verdicts"]["pass"] += 1
    forged["summary"]["operators"]["verdicts"]["fail"] -= 1
    json_report.seal(forged)
    problems = _verify(forged, run).problems
    assert any("inconsistent: /operators/1" in p for p in problems), problems


def test_every_rendering_shows_the_failing_cells():
    document = json_report.to_document(make_run())
    text = markdown.render(document)
    assert "### Operators" in text and "3 operators checked, 2 claimed" in text
    assert "| mul | int32 | fail | forward: fail (forward fail ) |" in text
    page = html_report.render(document)
    assert 'id="operator-matrix"' in page and 'class="cell v-fail"' in page and 'class="cell v-not-claimed"' in page
    failing = next(c for c in document["contracts"] if c["id"] == "ST-ONE-001")["tests"][1]
    failing["nodeid"] = "test_opinfo.py::test_operator[mul]"   # the operator's test (not resealed: rendering only)
    root = ET.fromstring(junit.render(document).encode("utf-8"))
    [case] = [c for c in root.iter("testcase") if c.get("name") == "test_opinfo.py::test_operator[mul]"]
    assert "int32: fail" in case.find("system-out").text
    assert "mul int32: fail: forward: fail" in case.find("failure").text


def test_diff_shows_operator_regressions_inside_an_already_failing_contract():
    old = json_report.to_document(make_run())
    new_run = make_run()
    new_run.operators = make_operators(mul_int32=V.CRASH)
    new_run.operators[0].cells[0].checks["forward"] = V.FAIL   # add float32 breaks as well
    result = diff.diff(old, json_report.to_document(new_run))
    assert [(c.operator, c.dtype, c.old, c.new) for c in result.operator_regressions] == [
        ("add", "float32", "pass", "fail"), ("mul", "int32", "fail", "crash")]
    assert result.regressed
    assert "Operator regressions (2)" in diff.format_text(result)
    back = diff.diff(json_report.to_document(new_run), old)
    assert [(c.operator, c.dtype) for c in back.operator_fixes] == [("add", "float32")]
