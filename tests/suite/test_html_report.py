"""The HTML report: its structure (stdlib parser), and what a real browser paints of it."""

from __future__ import annotations

import json
import math
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_rlrollout.suite.options import CONFORMANCE
from pytest_rlrollout.suite.report.html import html as render
from pytest_rlrollout.suite.report.model import Report
from pytest_rlrollout.suite.report.timeline import NEW_COLOUR, OLD_COLOUR

XSS = "<script>alert(1)</script>"
GEOMETRY = {"x", "y", "x1", "x2", "y1", "y2", "cx", "cy", "r", "width", "height"}
VOID = {"meta", "input", "br", "hr", "img", "link", "col", "wbr"}


def _timeline() -> dict[str, Any]:
    chunks: list[list[Any]] = [[0.0, None]]
    chunks += [[round(0.05 * i, 4), "snap-A" if i < 22 else "snap-B"] for i in range(1, 41)]
    return {
        "title": "a stream across an ASYNC swap",
        "old": "snap-A",
        "new": "snap-B",
        "chunks": chunks,
        "marks": [[0.6, "signal"], [0.62, "answered"], [1.1, "served"]],
        "replicas": [
            [0.0, 0, "serving snap-A"],
            [0.0, 1, "serving snap-A"],
            [0.65, 0, "swapping snap-B"],
            [0.65, 1, "loading snap-B"],
            [1.1, 0, "serving snap-B"],
            [1.4, 1, "serving snap-B"],
        ],
        "probes": [[0.66, 0.7, 425], [0.8, 0.83, 425], [1.0, 1.02, 425], [1.15, 1.3, 200], [1.2, 1.35, 200]],
    }


def _test(node: str, outcome: str, **kw: Any) -> dict[str, Any]:
    return {
        "test": node,
        "outcome": outcome,
        "reason": "",
        "observed": "",
        "exchanges": [],
        "timeline": None,
        "duration": 0.4,
    } | kw


def _clause(cid: str, level: str, outcome: str, rule: str, evidence: str, *tests: dict[str, Any]) -> dict[str, Any]:
    area = cid.split("-")[0]
    return {
        "clause": cid,
        "level": level,
        "area": area,
        "rule": rule,
        "outcome": outcome,
        "evidence": evidence,
        "duration": sum(t["duration"] for t in tests),
        "tests": list(tests),
    }


def _doc() -> dict[str, Any]:
    """A realistic report, swap clause first so its picture is within the browser's window."""
    swap = _test(
        "pytest_rlrollout/suite/conformance/test_swap.py::test_async_version_changes_once",
        "pass",
        observed="40 chunks with a policy version; 1 change",
        timeline=_timeline(),
        duration=2.1,
    )
    exchange = (
        'POST /v1/completions -> 200\n  sent: {"prompt": "hi", "max_tokens": 5}\n'
        f'  answer: {{"usage": {{"completion_tokens": 6}}, "text": "{XSS}"}}'
    )
    usage = _test(
        "pytest_rlrollout/suite/conformance/test_inference.py::test_usage_counts",
        "fail",
        reason="usage.completion_tokens is 6, 5 tokens were returned\nassert 6 == 5",
        observed="1 completion",
        exchanges=[exchange, 'GET /v1/status -> 200\n  answer: {"replicas": []}'],
    )
    hint = _test("pytest_rlrollout/suite/conformance/test_hint.py::test_hint", "unsupported", reason="no hint endpoint")
    clauses = [
        _clause(
            "SWAP-ASYNC-2",
            "MUST",
            "pass",
            "ASYNC: the streamed policy version changes at most once per stream.",
            "observed: 40 chunks with a policy version; 1 change",
            swap,
        ),
        _clause(
            "INF-USAGE-1",
            "MUST",
            "fail",
            "usage.completion_tokens equals the tokens returned (< 2^31).",
            "usage.completion_tokens is 6, 5 tokens were returned",
            usage,
        ),
        _clause(
            "HL-HINT-1",
            "MAY",
            "unsupported",
            "A hint endpoint accepts the next snapshot's identity.",
            "no hint endpoint",
            hint,
        ),
        _clause(
            "R3-SHAPE-1",
            "SHOULD",
            "not-applicable",
            "Routing matrices have one row per token.",
            "a dense model has no routing",
            _test("t.py::test_r3", "not-applicable", reason="dense"),
        ),
    ]
    return {
        "provenance": {
            "deployment": "http://127.0.0.1:8000 <local>",
            "mode": "local",
            "suite_version": "0.2.0",
            "finished": "2026-03-01T12:00:00Z",
        },
        "contract": {"version": "1+000000000000", "document": "docs/contract.md (or `rlrollout clauses --format md`)"},
        "engine": {"name": "fireworks", "decided": "the status endpoint names fireworks"},
        "capabilities": [
            {
                "name": "logprobs",
                "has": True,
                "seen": "6 logprobs entries",
                "about": "per-token logprobs",
                "required": True,
            },
            {"name": "hint", "has": False, "seen": "404 on /hint", "about": "prefetch hint", "required": True},
            {"name": "routing", "has": False, "seen": "no routing matrices", "about": "R3", "required": False},
        ],
        "summary": {
            "levels": {"MUST": {"pass": 1, "fail": 1}, "SHOULD": {"not-applicable": 1}, "MAY": {"unsupported": 1}},
            "areas": {"SWAP": {"pass": 1}, "INF": {"fail": 1}, "HL": {"unsupported": 1}, "R3": {"not-applicable": 1}},
        },
        "clauses": {c["clause"]: c for c in clauses},
    }


def html(doc: dict[str, Any]) -> str:
    """The HTML writer's page of a report document, read into the model as a report on disk is."""
    return render(Report.from_json(doc))


class _Elements(HTMLParser):
    """Every element with its ancestors' (tag, classes), and every text with its element's."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.stack: list[tuple[str, dict[str, str], list[tuple[str, set[str]]]]] = []
        self.elements: list[tuple[str, dict[str, str], list[tuple[str, set[str]]]]] = []
        self.texts: list[tuple[str, list[tuple[str, set[str]]]]] = []
        self.feed(text)

    def _path(self) -> list[tuple[str, set[str]]]:
        return [(tag, set(attrs.get("class", "").split())) for tag, attrs, _ in self.stack]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = (tag, {k: v or "" for k, v in attrs}, self._path())
        self.elements.append(element)
        if tag not in VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}, self._path()))

    def handle_endtag(self, tag: str) -> None:
        while self.stack and self.stack.pop()[0] != tag:
            pass

    def handle_data(self, data: str) -> None:
        self.texts.append((data, self._path()))

    def inside(self, tag: str, cls: str) -> list[tuple[str, dict[str, str]]]:
        return [(t, a) for t, a, path in self.elements if any(p == tag and cls in cs for p, cs in path)]

    def text_inside(self, tag: str, cls: str) -> str:
        return " ".join(d for d, path in self.texts if any(p == tag and cls in cs for p, cs in path))


def _check_structure(page: _Elements, doc: dict[str, Any]) -> None:
    figures = [(t, a) for t, a, _ in page.elements if t == "figure" and "timeline" in a.get("class", "")]
    assert len(figures) == 1
    in_figure = page.inside("figure", "timeline")
    assert [a.get("role") for t, a in in_figure if t == "svg"] == ["img"]
    chunks = [a for t, a in in_figure if t in ("circle", "rect") and "chunk" in a.get("class", "")]
    assert len(chunks) == len(doc["clauses"]["SWAP-ASYNC-2"]["tests"][0]["timeline"]["chunks"])
    assert {a["fill"].lower() for a in chunks} >= {OLD_COLOUR.lower(), NEW_COLOUR.lower()}
    assert any(t == "rect" and "probe" in a.get("class", "") for t, a in in_figure)
    legend = page.text_inside("g", "legend")
    assert "snap-A" in legend and "snap-B" in legend
    by_id = {a["id"]: a for t, a, _ in page.elements if a.get("id")}
    for cid, c in doc["clauses"].items():
        assert {"clause", c["outcome"]} <= set(by_id[cid]["class"].split()), cid


def test_html_structure() -> None:
    doc = _doc()
    text = html(doc)
    page = _Elements(text)
    _check_structure(page, doc)
    assert "src=" not in text and 'href="http' not in text and "url(" not in text and "@import" not in text
    assert all(a["href"].startswith("#") for t, a, _ in page.elements if "href" in a)
    assert not [t for t, _, _ in page.elements if t == "script"]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and XSS not in text
    failures = [a["href"] for t, a, path in page.elements if t == "a" and ("ul", {"failures"}) in path]
    assert failures == ["#INF-USAGE-1"]
    opened = [a for t, a, path in page.elements if t == "details" and ("div", {"test", "fail"}) in path]
    assert opened and all("open" in a for a in opened)
    assert "missing" in page.text_inside("tr", "missing")


@pytest.mark.parametrize(
    "timeline",
    [
        {"title": "nothing seen", "old": None, "new": None, "chunks": [], "marks": [], "replicas": [], "probes": []},
        {
            "title": "one instant",
            "old": None,
            "new": None,
            "chunks": [[0.0, "x"], [0.0, "y"], [0.0, None]],
            "marks": [[0.0, "signal"]],
            "replicas": [[0.0, 0, "error x"]],
            "probes": [[0.0, 0.0, 503]],
        },
    ],
)
def test_degenerate_timelines(timeline: dict[str, Any]) -> None:
    doc = _doc()
    doc["clauses"]["SWAP-ASYNC-2"]["tests"][0]["timeline"] = timeline
    page = _Elements(html(doc))
    assert [t for t, _ in page.inside("figure", "timeline") if t == "svg"] == ["svg"]
    for _, a in page.inside("figure", "timeline"):
        assert all(math.isfinite(float(a[k])) for k in GEOMETRY & a.keys()), a


def _rgb(png: bytes) -> np.ndarray:
    """A PNG's pixels as an (h, w, 3) array: 8-bit RGB(A), not interlaced, all five filters."""
    pos, idat, header = 8, b"", b""
    while pos < len(png):
        n, kind = struct.unpack(">I4s", png[pos : pos + 8])
        chunk = png[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            header = chunk
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + n
    w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    bpp = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + w * bpp)
    filters, data = raw[:, 0].astype(np.int32), raw[:, 1:].reshape(h, w, bpp).astype(np.int32)
    out = np.zeros((h + 1, w + 1, bpp), np.int32)  # a zero row above and a zero column to the left
    # A pixel depends on its left, upper and upper-left neighbours: decode one anti-diagonal at a time.
    for d in range(h + w - 1):
        r = np.arange(max(0, d - w + 1), min(h, d + 1))
        i = d - r
        a, b, c, f = out[r + 1, i], out[r, i + 1], out[r, i], filters[r][:, None]
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        paeth = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
        pred = np.select([f == 1, f == 2, f == 3, f == 4], [a, b, (a + b) // 2, paeth], 0)
        out[r + 1, i + 1] = (data[r, i] + pred) % 256
    return out[1:, 1:, :3].astype(np.uint8)


def _count(pixels: np.ndarray, colour: str, tolerance: int = 6) -> int:
    want = np.array([int(colour[k : k + 2], 16) for k in (1, 3, 5)], np.int32)
    return int((np.abs(pixels.astype(np.int32) - want).max(axis=2) <= tolerance).sum())


def browse(directory: Path, page: Path, height: int = 2400) -> tuple[str, np.ndarray]:
    """What headless Chromium makes of `page`: its DOM after loading, and a screenshot's pixels."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    png = directory / "report.png"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--hide-scrollbars",
        f"--window-size=1200,{height}",
    ]

    def run(*args: str, profile: str) -> subprocess.Popen[bytes]:
        data = f"--user-data-dir={directory / profile}"
        return subprocess.Popen(
            [chromium, *flags, data, *args, f"file://{page}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    # Two browsers at once: each spends most of its time starting up.
    browsers = [run(f"--screenshot={png}", profile="shot"), run("--dump-dom", profile="dump")]
    try:
        (_, shot_err), (dom, dump_err) = (b.communicate(timeout=60) for b in browsers)
    finally:
        for b in browsers:
            if b.poll() is None:
                b.kill()
    assert [b.returncode for b in browsers] == [0, 0], (shot_err.decode()[-2000:], dump_err.decode()[-2000:])
    pixels = _rgb(png.read_bytes())
    assert pixels.shape[:2] == (height, 1200)
    return dom.decode(), pixels


def test_browser_renders_the_timeline(tmp_path) -> None:
    doc = _doc()
    page = tmp_path / "report.html"
    page.write_text(html(doc))
    dom, pixels = browse(tmp_path, page)
    _check_structure(_Elements(dom), doc)
    painted = {name: _count(pixels, colour) for name, colour in (("old", OLD_COLOUR), ("new", NEW_COLOUR))}
    assert painted["old"] > 200 and painted["new"] > 200, painted


def test_a_real_runs_report_in_the_browser(pytester, tmp_path) -> None:
    """The suite's own report of swap tests against the reference deployment: a timeline
    picture per swap test, the stream's chunks painted in the old and the new version's colour."""
    result = pytester.runpytest_inprocess(
        str(CONFORMANCE / "test_swap.py"),
        "-p",
        "no:randomly",
        "-k",
        "changes_once or are_queued",
        "--rl-report=out/report.json",
    )
    assert result.ret == 0, result.outlines[-20:]
    doc = json.loads((pytester.path / "out" / "report.json").read_text())
    timelines = [t["timeline"] for c in doc["clauses"].values() for t in c["tests"] if t["timeline"]]
    assert len(timelines) == 2 and all(t["chunks"] or t["probes"] for t in timelines)
    dom, pixels = browse(tmp_path, pytester.path / "out" / "report.html", height=3000)
    page = _Elements(dom)
    figures = [a for t, a, _ in page.elements if t == "figure" and "timeline" in a.get("class", "")]
    assert len(figures) == 2
    in_figures = page.inside("figure", "timeline")
    assert sum(t in ("circle", "rect") and "chunk" in a.get("class", "") for t, a in in_figures) == sum(
        len(t["chunks"]) for t in timelines
    )
    painted = {name: _count(pixels, colour) for name, colour in (("old", OLD_COLOUR), ("new", NEW_COLOUR))}
    assert painted["old"] > 100 and painted["new"] > 100, painted
