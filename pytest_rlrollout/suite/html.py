"""The HTML report: one self-contained page (inline CSS and SVG, PNG pictures as data: URIs, no
script, nothing fetched) that a person reads instead of the JSON. Everything shown comes from the
deployment under test, so every text goes through `escape`.
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Callable
from html import escape
from typing import Any

from pytest_rlrollout.contract import SEVERITY
from pytest_rlrollout.numerics.pictures import TITLES
from pytest_rlrollout.suite.report import (
    NUMERICS_INTRO,
    deciding,
    figures_note,
    is_numerics,
    numerics_grid,
    numerics_pictures,
    numerics_tests,
    upload_cells,
)

OUTCOMES = tuple(str(o) for o in reversed(SEVERITY))  # most telling last, as the Markdown report
OUTCOME_COLOURS = {"pass": "#2e7d32", "not-applicable": "#b0bec5", "unsupported": "#78909c",
                   "inconclusive": "#f9a825", "fail": "#c62828", "error": "#6a1b9a"}  # fmt: skip
UNKNOWN_COLOUR = "#9e9e9e"

# The timeline: old and new snapshots must never be confused, so blue against magenta.
OLD_COLOUR = "#1f6fd1"
NEW_COLOUR = "#e0157f"
NONE_COLOUR = "#a0a0a0"
EXTRA_VERSION_COLOURS = ("#8c564b", "#17becf", "#9467bd", "#bcbd22", "#5d4037", "#00897b")
TRANSITION_COLOUR = "#ffcc80"
ERROR_STATE_COLOUR = "#d62728"
OTHER_STATE_COLOUR = "#d5d9de"
PROBE_OK_COLOUR = "#2ca02c"
PROBE_RETRY_COLOUR = "#f0a202"
PROBE_BAD_COLOUR = "#d62728"
MARK_COLOUR = "#444444"
TRANSITIONAL = ("pending", "downloading", "loading", "swapping", "draining")  # a replica between snapshots

WIDTH, LEFT, RIGHT, LANE, GAP = 900, 90, 20, 22, 6  # the timeline's geometry in viewBox units
CHAR = 6.2  # estimated width of one 11px character, to keep labels from colliding

CSS = """
*{box-sizing:border-box} a{color:#1a5fb4} summary{cursor:pointer;color:#4a545e} .muted{color:#8a939c}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif;color:#1d2327;background:#fff;
  max-width:1150px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:0 0 6px} h3{font-size:16px;margin:22px 0 6px}
h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #dde1e6;padding-bottom:2px}
dl.provenance{display:grid;grid-template-columns:max-content 1fr;gap:1px 14px;margin:8px 0}
dl.provenance dt{color:#5f6b76;font-weight:600} dl.provenance dd{margin:0;word-break:break-word}
.badge{display:inline-block;padding:0 8px;border-radius:9px;font-size:12px;font-weight:600;white-space:nowrap}
.headline .badge{font-size:13px;margin-right:4px}
table{border-collapse:collapse;margin:6px 0} tr.missing td{background:#fdecea}
th,td{padding:3px 10px;border-bottom:1px solid #e4e6ea;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums} td.zero{color:#c4c8cc}
tr.group th{background:#f3f4f6;font-size:12px;color:#5f6b76}
.bar{display:flex;width:200px;height:12px;margin-top:4px;border-radius:3px;overflow:hidden;background:#eee}
.tag{color:#fff;background:#c62828;border-radius:3px;padding:0 5px;font-size:11px;font-weight:700}
.clause{border:1px solid #e1e4e8;border-left:6px solid #9e9e9e;border-radius:4px;padding:8px 12px;margin:10px 0}
.clause h4{margin:0;font-size:15px} .clause h4 a{color:inherit;text-decoration:none}
.level{font-size:12px;color:#5f6b76;font-weight:600;margin:0 6px}
.rule{margin:4px 0} .evidence{margin:4px 0;color:#4a545e}
.test{border-top:1px dashed #e1e4e8;margin-top:8px;padding-top:6px} .test p{margin:3px 0}
.test code{font-size:12px;word-break:break-all}
pre{background:#f6f8fa;border:1px solid #e1e4e8;border-radius:3px;padding:6px 8px;margin:4px 0;font-size:12px;
  white-space:pre-wrap;word-break:break-word;max-height:30em;overflow:auto}
figure.timeline{margin:8px 0} figcaption{color:#4a545e;font-size:12px}
figure.timeline svg{display:block;width:100%;max-width:900px;height:auto}
.pictures{display:flex;flex-wrap:wrap;gap:8px 16px} figure.numerics{margin:8px 0;flex:1 1 420px;max-width:540px}
figure.numerics img{display:block;width:100%;height:auto;border:1px solid #e4e6ea}
table.uploads{font-size:12px;margin:4px 0} .figures{color:#1d2327;font-variant-numeric:tabular-nums}
#only-problems:checked~#clauses .clause.pass,#only-problems:checked~#clauses .clause.not-applicable{display:none}
"""


def _ink(colour: str) -> str:
    """Black or white, whichever reads on `colour`."""
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return "#000" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#fff"


def _outcome_css() -> str:
    return "".join(
        f".o-{o}{{background:{c};color:{_ink(c)}}}.clause.{o}{{border-left-color:{c}}}"
        for o, c in OUTCOME_COLOURS.items()
    )


def _badge(outcome: str) -> str:
    return f'<span class="badge o-{escape(outcome)}">{escape(outcome)}</span>'


def _header(doc: dict[str, Any]) -> str:
    prov = doc.get("provenance") or {}
    counts = Counter(c["outcome"] for c in doc["clauses"].values())
    order = sorted(counts, key=lambda o: OUTCOMES.index(o) if o in OUTCOMES else len(OUTCOMES))
    headline = " ".join(f'<span class="badge o-{escape(o)}">{counts[o]} {escape(o)}</span>' for o in order)
    rows = "".join(f"<dt>{escape(str(k))}</dt><dd>{escape(str(v))}</dd>" for k, v in prov.items())
    engine = doc.get("engine")
    rows += f"<dt>engine</dt><dd>{escape(engine['name'])} ({escape(engine['decided'])})</dd>" if engine else ""
    contract = doc.get("contract") or {}
    rows += f"<dt>contract</dt><dd>{escape(str(contract.get('document', '')))}, version {escape(str(contract.get('version', '')))}</dd>"
    return (
        f"<header><h1>RL-rollout conformance: {escape(str(prov.get('deployment', '')))}</h1>"
        f'<p class="headline">{len(doc["clauses"])} clauses: {headline}</p><dl class="provenance">{rows}</dl></header>'
    )


def _failures(doc: dict[str, Any]) -> str:
    bad = [(cid, c) for cid, c in doc["clauses"].items() if c["outcome"] in ("fail", "error")]
    if not bad:
        return '<h2>Failures</h2><p class="muted">No clause failed.</p>'
    items = "".join(
        f'<li>{_badge(c["outcome"])} <a href="#{escape(cid)}">{escape(cid)}</a>'
        f'<span class="level">{escape(c["level"])}</span>{escape(_short(c["evidence"]))}</li>'
        for cid, c in bad
    )
    return f'<h2>Failures</h2><ul class="failures">{items}</ul>'


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text[: limit - 1] + "…" if len(text) > limit else text


def _summary(doc: dict[str, Any]) -> str:
    head = "".join(f"<th>{_badge(o)}</th>" for o in OUTCOMES)
    body = ""
    for group, title in (("levels", "by level"), ("areas", "by area")):
        body += f'<tr class="group"><th colspan="{len(OUTCOMES) + 2}">{title}</th></tr>'
        for name, counts in doc["summary"].get(group, {}).items():
            total = sum(counts.values()) or 1
            cells = "".join(
                f'<td class="n{"" if counts.get(o) else " zero"}">{counts.get(o, 0)}</td>' for o in OUTCOMES
            )
            bar = "".join(
                f'<span class="o-{o}" style="width:{100 * counts[o] / total:.2f}%" title="{counts[o]} {o}"></span>'
                for o in OUTCOMES
                if counts.get(o)
            )
            body += f'<tr><th>{escape(name)}</th>{cells}<td><div class="bar">{bar}</div></td></tr>'
    return f'<h2>Summary</h2><table class="summary"><tr><th></th>{head}<th></th></tr>{body}</table>'


def _capabilities(doc: dict[str, Any]) -> str:
    caps = doc.get("capabilities") or []
    if not caps:
        return ""
    engine = escape((doc.get("engine") or {}).get("name", "engine"))
    rows = ""
    for c in caps:
        missing = c["required"] and not c["has"]
        offered = "yes" if c["has"] else ('<span class="tag">missing</span>' if missing else "no")
        rows += (
            f"<tr{' class=missing' if missing else ''}><th>{escape(c['name'])}</th><td>{offered}</td>"
            f"<td>{'yes' if c['required'] else ''}</td><td>{escape(str(c['seen']))}</td>"
            f'<td class="muted">{escape(str(c.get("about", "")))}</td></tr>'
        )
    head = f"<tr><th>capability</th><th>offered</th><th>required by {engine}</th><th>seen</th><th>about</th></tr>"
    return f'<h2>Capabilities</h2><table class="capabilities">{head}{rows}</table>'


def _test(t: dict[str, Any]) -> str:
    out = f'<div class="test {escape(t["outcome"])}">{_badge(t["outcome"])} <code>{escape(t["test"])}</code>'
    out += f' <span class="muted">{t.get("duration", 0):.2f} s</span>'
    if t.get("reason"):
        out += f'<pre class="reason">{escape(t["reason"])}</pre>'
    if t.get("observed"):
        out += f"<p>observed: {escape(t['observed'])}</p>"
    if t.get("exchanges"):
        opened = " open" if t["outcome"] in ("fail", "error") else ""
        pres = "".join(f"<pre>{escape(e)}</pre>" for e in t["exchanges"])
        out += f"<details{opened}><summary>{len(t['exchanges'])} exchanges</summary>{pres}</details>"
    if t.get("uploads"):
        out += _uploads(t["uploads"])
    if t.get("timeline"):
        out += _timeline(t["timeline"])
    return out + "</div>"


def _uploads(uploads: list[dict[str, Any]]) -> str:
    """What a swap test uploaded, one row per snapshot it built."""
    cells = ("snapshot", "kind", "uploaded", "copied in the bucket", "of a full snapshot")
    head = "<tr>" + "".join(f"<th>{c}</th>" for c in cells) + "</tr>"
    rows = "".join(
        "<tr>"
        + "".join(f"<td{' class=n' if i > 1 else ''}>{escape(x)}</td>" for i, x in enumerate(upload_cells(u)))
        + "</tr>"
        for u in uploads
    )
    return f'<table class="uploads">{head}{rows}</table>'


def _numerics(doc: dict[str, Any], pictures: dict[str, dict[str, bytes]], why: str | None) -> str:
    """The NUM figures side by side (one column per test) and their pictures, embedded."""
    tests = numerics_tests(doc)
    if not tests:
        return ""
    head = "".join(f'<th><a href="#{escape(cid)}">{escape(cid)}</a> {_badge(t["outcome"])}</th>' for _, cid, t in tests)
    rows = "".join(
        f"<tr><th>{escape(label)}</th>" + "".join(f'<td class="n">{escape(v)}</td>' for v in values) + "</tr>"
        for label, values in numerics_grid(tests)
    )
    figures = ""
    for key, cid, _ in tests:
        for name, png in pictures.get(key, {}).items():
            what = f"{cid}: {TITLES.get(name, name)}"
            data = base64.b64encode(png).decode("ascii")
            figures += (f'<figure class="numerics"><img alt="{escape(what)}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{escape(what)}</figcaption></figure>")  # fmt: skip
    note = f'<p class="muted">No pictures: {escape(why)}</p>' if why else ""
    return (
        f'<h2 id="numerics">Numerics</h2><p>{escape(NUMERICS_INTRO)}</p>'
        f'<table class="numerics"><tr><th>figure</th>{head}</tr>{rows}</table>'
        f'{note}<div class="pictures">{figures}</div>'
    )


def _clauses(doc: dict[str, Any]) -> str:
    areas: dict[str, list[str]] = {}
    for cid, c in doc["clauses"].items():
        tests = "".join(_test(t) for t in c["tests"])
        areas.setdefault(c["area"], []).append(
            f'<article class="clause {escape(c["outcome"])}" id="{escape(cid)}"><h4><a href="#{escape(cid)}">'
            f'{escape(cid)}</a><span class="level">{escape(c["level"])}</span>{_badge(c["outcome"])}</h4>'
            f'<p class="rule">{escape(c["rule"])}</p><p class="evidence">{escape(c["evidence"])}{_figures(c)}</p>'
            f"{tests}</article>"
        )
    body = "".join(f'<section class="area"><h3>{escape(a)}</h3>{"".join(cs)}</section>' for a, cs in areas.items())
    # A checkbox and a CSS sibling rule, so the filter works with scripts disabled.
    return (
        '<h2>Clauses</h2><input type="checkbox" id="only-problems"><label for="only-problems"> hide passing and '
        f'not-applicable clauses</label><section id="clauses">{body}</section>'
    )


def _figures(clause: dict[str, Any]) -> str:
    """The deciding test's few figures (FID's max |Δ|), after the evidence; for the NUM figures, a
    link to the section that shows them."""
    figures = deciding(clause).get("figures")
    if is_numerics(figures):
        return ' <a class="figures" href="#numerics">(figures and pictures)</a>'
    note = figures_note(figures)
    return f' <span class="figures">({escape(note)})</span>' if note else ""


def _version_colours(tl: dict[str, Any]) -> dict[str | None, str]:
    """Old and new get their fixed colours; any other version the next free one."""
    seen = [v for _, v in tl.get("chunks") or []]
    # "serving None" is a replica with no snapshot, not a version
    seen += [s[8:] for _, _, s in tl.get("replicas") or [] if s.startswith("serving ") and s != "serving None"]
    colours: dict[str | None, str] = {None: NONE_COLOUR}
    for version, colour in ((tl.get("old"), OLD_COLOUR), (tl.get("new"), NEW_COLOUR)):
        if version is not None:
            colours.setdefault(version, colour)
    free = [c for c in (OLD_COLOUR, NEW_COLOUR, *EXTRA_VERSION_COLOURS) if c not in colours.values()]
    for v in seen:
        if v not in colours:
            colours[v] = free.pop(0) if free else UNKNOWN_COLOUR
    return colours


def _state_colour(status: str, colours: dict[str | None, str]) -> str:
    word, _, rest = status.partition(" ")
    if word == "serving" and rest != "None" and rest in colours:
        return colours[rest]
    if word in ("error", "failed"):
        return ERROR_STATE_COLOUR
    return TRANSITION_COLOUR if word in TRANSITIONAL else OTHER_STATE_COLOUR


def _probe_colour(status: int) -> str:
    return PROBE_OK_COLOUR if status == 200 else PROBE_RETRY_COLOUR if status == 425 else PROBE_BAD_COLOUR


def _pack(spans: list[tuple[float, float]], rows: int) -> list[int]:
    """A row for each span so that spans in one row do not overlap (while `rows` suffice)."""
    ends: list[float] = []
    out = [0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: spans[i][0]):
        start, end = spans[i]
        row = next((r for r, e in enumerate(ends) if e <= start), None)
        if row is None and len(ends) < rows:
            row = len(ends)
            ends.append(end)
        row = min(range(len(ends)), key=ends.__getitem__) if row is None else row
        ends[row], out[i] = max(ends[row], end), row
    return out


def _el(tag: str, inner: str = "", tip: str = "", **attrs: Any) -> str:
    """An SVG element with `tip` as its tooltip: `class_` and `stroke_dasharray` spell class and
    stroke-dasharray; floats get one decimal."""
    said = " ".join(f'{k.rstrip("_").replace("_", "-")}="{escape(f"{v:.1f}" if isinstance(v, float) else str(v))}"'
                    for k, v in attrs.items())  # fmt: skip
    return f"<{tag} {said}>{inner}{f'<title>{escape(tip)}</title>' if tip else ''}</{tag}>"


def _lane(y: float, height: float, name: str) -> str:
    back = _el("rect", x=LEFT, y=y, width=WIDTH - LEFT - RIGHT, height=height, fill="#f3f4f6")
    return back + _el("text", escape(name), x=LEFT - 8, y=y + height / 2 + 4, text_anchor="end")


def _axis(y: float, lo: float, hi: float, x: Callable[[float], float]) -> str:
    span = hi - lo
    step = next((m * 10.0**e for e in range(-4, 7) for m in (1, 2, 5) if span / (m * 10.0**e) <= 10), span)
    out = _el("line", x1=LEFT, x2=WIDTH - RIGHT, y1=y, y2=y, stroke="#666")
    k = -(-lo // step)
    while k * step <= hi + 1e-9:
        tx = x(k * step)
        out += _el("line", x1=tx, x2=tx, y1=y, y2=y + 5, stroke="#666")
        out += _el("text", f"{round(k * step, 6):g} s", x=tx, y=y + 17, text_anchor="middle")
        k += 1
    return out


def _stream(y: float, chunks: list[list[Any]], x: Callable[[float], float], colours: dict[str | None, str]) -> str:
    out = _lane(y, LANE, "stream")
    for t, v in chunks:
        tip, fill = f"{t:g} s: {v if v is not None else 'no policy version'}", colours.get(v, UNKNOWN_COLOUR)
        out += _el("circle", tip=tip, class_="chunk", cx=x(t), cy=y + LANE / 2, r=3.5, fill=fill)
    return out


def _replica(y: float, changes: list[tuple[float, str]], hi: float, x: Callable[[float], float],
             colours: dict[str | None, str]) -> str:  # fmt: skip
    """A replica's states as segments: each status holds until the replica's next change."""
    out = ""
    for k, (t, status) in enumerate(changes):
        end = changes[k + 1][0] if k + 1 < len(changes) else hi
        x0, x1 = x(t), max(x(end), x(t) + 2)  # the last change still shows, as a sliver
        fill = _state_colour(status, colours)
        tip = f"{status}: {t:g}–{end:g} s"
        out += _el("rect", tip=tip, class_="state", x=x0, y=y + 2, width=x1 - x0, height=LANE - 4, fill=fill)
        if x1 - x0 > len(status) * CHAR + 8:
            out += _el("text", escape(status), x=x0 + 4, y=y + LANE / 2 + 4, fill=_ink(fill))
    return out


def _probes(y: float, probes: list[list[Any]], x: Callable[[float], float]) -> tuple[str, float]:
    """Probes as bars from sent to answered, stacked where they overlap; returns the lane's height."""
    rows = _pack([(x(s), max(x(a), x(s) + 2)) for s, a, _ in probes], 6)
    height = max(LANE, 8 * (max(rows) + 1) + 4)
    out = _lane(y, height, "probes")
    for (sent, answered, status), row in zip(probes, rows, strict=True):
        tip = f"HTTP {status}: sent {sent:g} s, answered {answered:g} s"
        width = max(x(answered) - x(sent), 2.0)
        out += _el("rect", tip=tip, class_="probe", x=x(sent), y=y + 2 + 8 * row, width=width, height=6,
                   fill=_probe_colour(status))  # fmt: skip
    return out, height


def _mark_labels(marks: list[list[Any]], x: Callable[[float], float]) -> list[tuple[float, int]]:
    """Where each mark's label goes: its x, kept inside the picture, and a row of the band above the lanes
    chosen so that labels do not collide."""
    starts = [min(x(t) + 3, WIDTH - len(str(w)) * CHAR) for t, w in marks]
    ends = [s + len(str(w)) * CHAR + 6 for s, (_, w) in zip(starts, marks, strict=True)]
    return list(zip(starts, _pack(list(zip(starts, ends, strict=True)), 3), strict=True))


def _marks(marks: list[list[Any]], labels: list[tuple[float, int]], bottom: float, x: Callable[[float], float]) -> str:
    out = ""
    for (t, what), (lx, row) in zip(marks, labels, strict=True):
        ly = 14 * row + 11
        out += _el("line", x1=x(t), x2=x(t), y1=ly + 2, y2=bottom, stroke=MARK_COLOUR, stroke_dasharray="4 3")
        out += _el("text", escape(str(what)), x=lx, y=ly, fill=MARK_COLOUR)
    return out


def _legend(y: float, items: list[tuple[str, str, bool]]) -> tuple[str, float]:
    """Swatches (a dot for a version, a bar otherwise) wrapped onto rows; returns the new bottom."""
    out, lx = "", float(LEFT)
    for colour, text, dot in items:
        width = 20 + len(text) * CHAR + 14
        if lx + width > WIDTH - RIGHT and lx > LEFT:
            lx, y = float(LEFT), y + 18
        if dot:
            out += _el("circle", cx=lx + 6, cy=y - 4, r=5, fill=colour)
        else:
            out += _el("rect", x=lx, y=y - 9, width=14, height=10, fill=colour)
        out += _el("text", escape(text), x=lx + 18, y=y)
        lx += width
    return f'<g class="legend">{out}</g>', y + 10


def _timeline(tl: dict[str, Any]) -> str:
    chunks, marks, replicas, probes = (tl.get(k) or [] for k in ("chunks", "marks", "replicas", "probes"))
    times = [c[0] for c in chunks] + [m[0] for m in marks] + [r[0] for r in replicas]
    times += [t for p in probes for t in p[:2]]
    lo, hi = min([0.0, *times]), max([0.0, *times])
    span = (hi - lo) or 1.0  # a timeline of one instant still gets an axis

    def x(t: float) -> float:
        return LEFT + (t - lo) / span * (WIDTH - LEFT - RIGHT)

    colours = _version_colours(tl)
    labels = _mark_labels(marks, x)
    y = 14.0 * (max((row for _, row in labels), default=-1) + 1) + 6  # below the mark labels
    lanes = ""
    if chunks:
        lanes, y = _stream(y, chunks, x, colours), y + LANE + GAP
    for i in sorted({r[1] for r in replicas}):
        changes = sorted((t, s) for t, j, s in replicas if j == i)
        lanes += _lane(y, LANE, f"replica {i}") + _replica(y, changes, hi, x, colours)
        y += LANE + GAP
    if probes:
        lane, height = _probes(y, probes, x)
        lanes, y = lanes + lane, y + height + GAP
    legend, height = _legend(y + 44, _legend_items(tl, colours))
    title = escape(str(tl.get("title", "timeline")))
    svg = (
        f'<svg role="img" viewBox="0 0 {WIDTH} {height:.0f}" width="{WIDTH}" height="{height:.0f}" font-size="11" '
        f'font-family="system-ui,sans-serif" fill="#333"><title>{title}</title>'
        f"{lanes}{_marks(marks, labels, y, x)}{_axis(y, lo, hi, x)}{legend}</svg>"
    )
    caption = f"{title}: {len(chunks)} chunks, {len({r[1] for r in replicas})} replicas, {len(probes)} probes"
    return f'<figure class="timeline">{svg}<figcaption>{caption}</figcaption></figure>'


def _legend_items(tl: dict[str, Any], colours: dict[str | None, str]) -> list[tuple[str, str, bool]]:
    """What the picture uses: versions as dots (old and new named so), then states and probe answers as bars."""
    roles = {tl.get("old"): " (old)", tl.get("new"): " (new)"}
    items = [(c, f"{v}{roles.get(v, '')}", True) for v, c in colours.items() if v is not None]
    if any(v is None for _, v in tl.get("chunks") or []):
        items.append((NONE_COLOUR, "no policy version", True))
    states = {_state_colour(s, colours) for _, _, s in tl.get("replicas") or []}
    codes = {_probe_colour(p[2]) for p in tl.get("probes") or []}
    keys = [(TRANSITION_COLOUR, "loading / swapping", states), (ERROR_STATE_COLOUR, "error", states),
            (OTHER_STATE_COLOUR, "other state", states), (PROBE_OK_COLOUR, "probe 200", codes),
            (PROBE_RETRY_COLOUR, "probe 425", codes), (PROBE_BAD_COLOUR, "probe, other status", codes)]  # fmt: skip
    return items + [(c, text, False) for c, text, used in keys if c in used]


def html(doc: dict[str, Any], pictures: dict[str, dict[str, bytes]] | None = None) -> str:
    """The report as one HTML page that needs nothing but itself (the NUM pictures are embedded as
    data: URIs). `pictures` are the NUM tests' pictures as `report.numerics_pictures` draws them;
    None draws them here."""
    why = (doc.get("numerics") or {}).get("no_pictures")
    if pictures is None:
        pictures, why = numerics_pictures(doc)
    title = escape(f"RL-rollout conformance: {(doc.get('provenance') or {}).get('deployment', '')}")
    body = _header(doc) + _failures(doc) + _summary(doc) + _capabilities(doc) + _numerics(doc, pictures, why)
    body += _clauses(doc)
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
        f'content="width=device-width,initial-scale=1"><title>{title}</title><style>{CSS}{_outcome_css()}</style>'
        f"</head><body>{body}</body></html>\n"
    )
