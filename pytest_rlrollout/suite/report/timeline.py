"""A swap test's timeline as an SVG picture's geometry: lanes for the stream's chunks (coloured by
policy version), each replica's states and the probes sent during the swap, marks for the signal
and its answer, an axis in seconds and a legend. Only numbers and words are computed here; the
HTML template writes the elements (and escapes every text, all of which came from the deployment).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pytest_rlrollout.suite.report.model import Timeline

# Old and new snapshots must never be confused, so blue against magenta.
OLD_COLOUR = "#1f6fd1"
NEW_COLOUR = "#e0157f"
NONE_COLOUR = "#a0a0a0"
UNKNOWN_COLOUR = "#9e9e9e"
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

X = Callable[[float], float]


@dataclass(frozen=True)
class Shape:
    """One SVG element: its tag, attributes (as written), text and tooltip."""

    tag: str
    attrs: tuple[tuple[str, str], ...]
    text: str = ""
    tip: str = ""


def shape(tag: str, text: str = "", tip: str = "", **attrs: float | int | str) -> Shape:
    """`class_` and `stroke_dasharray` spell class and stroke-dasharray; floats get one decimal."""
    said = tuple(
        (k.rstrip("_").replace("_", "-"), f"{v:.1f}" if isinstance(v, float) else str(v)) for k, v in attrs.items()
    )
    return Shape(tag, said, text, tip)


@dataclass(frozen=True)
class Picture:
    title: str
    width: int
    height: int
    shapes: list[Shape]  # lanes, marks and axis, in painting order
    legend: list[Shape]
    caption: str


def ink(colour: str) -> str:
    """Black or white, whichever reads on `colour` (#rrggbb)."""
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return "#000" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#fff"


def version_colours(tl: Timeline) -> dict[str | None, str]:
    """Old and new get their fixed colours; any other version the next free one."""
    seen = [v for _, v in tl.chunks]
    # "serving None" is a replica with no snapshot, not a version
    seen += [s[8:] for _, _, s in tl.replicas if s.startswith("serving ") and s != "serving None"]
    colours: dict[str | None, str] = {None: NONE_COLOUR}
    for version, colour in ((tl.old, OLD_COLOUR), (tl.new, NEW_COLOUR)):
        if version is not None:
            colours.setdefault(version, colour)
    free = [c for c in (OLD_COLOUR, NEW_COLOUR, *EXTRA_VERSION_COLOURS) if c not in colours.values()]
    for v in seen:
        if v not in colours:
            colours[v] = free.pop(0) if free else UNKNOWN_COLOUR
    return colours


def state_colour(status: str, colours: dict[str | None, str]) -> str:
    word, _, rest = status.partition(" ")
    if word == "serving" and rest != "None" and rest in colours:
        return colours[rest]
    if word in ("error", "failed"):
        return ERROR_STATE_COLOUR
    return TRANSITION_COLOUR if word in TRANSITIONAL else OTHER_STATE_COLOUR


def probe_colour(status: int) -> str:
    return PROBE_OK_COLOUR if status == 200 else PROBE_RETRY_COLOUR if status == 425 else PROBE_BAD_COLOUR


def pack(spans: list[tuple[float, float]], rows: int) -> list[int]:
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


def _lane(y: float, height: float, name: str) -> list[Shape]:
    return [
        shape("rect", x=LEFT, y=y, width=WIDTH - LEFT - RIGHT, height=height, fill="#f3f4f6"),
        shape("text", name, x=LEFT - 8, y=y + height / 2 + 4, text_anchor="end"),
    ]


def _axis(y: float, lo: float, hi: float, x: X) -> list[Shape]:
    span = hi - lo
    step = next((m * 10.0**e for e in range(-4, 7) for m in (1, 2, 5) if span / (m * 10.0**e) <= 10), span)
    out = [shape("line", x1=LEFT, x2=WIDTH - RIGHT, y1=y, y2=y, stroke="#666")]
    k = -(-lo // step)
    while k * step <= hi + 1e-9:
        tx = x(k * step)
        out += [
            shape("line", x1=tx, x2=tx, y1=y, y2=y + 5, stroke="#666"),
            shape("text", f"{round(k * step, 6):g} s", x=tx, y=y + 17, text_anchor="middle"),
        ]
        k += 1
    return out


def _stream(y: float, tl: Timeline, x: X, colours: dict[str | None, str]) -> list[Shape]:
    out = _lane(y, LANE, "stream")
    for t, v in tl.chunks:
        tip, fill = f"{t:g} s: {v if v is not None else 'no policy version'}", colours.get(v, UNKNOWN_COLOUR)
        out.append(shape("circle", tip=tip, class_="chunk", cx=x(t), cy=y + LANE / 2, r=3.5, fill=fill))
    return out


def _replica(
    y: float, changes: list[tuple[float, str]], hi: float, x: X, colours: dict[str | None, str]
) -> list[Shape]:
    """A replica's states as segments: each status holds until the replica's next change."""
    out: list[Shape] = []
    for k, (t, status) in enumerate(changes):
        end = changes[k + 1][0] if k + 1 < len(changes) else hi
        x0, x1 = x(t), max(x(end), x(t) + 2)  # the last change still shows, as a sliver
        fill = state_colour(status, colours)
        tip = f"{status}: {t:g}–{end:g} s"
        out.append(shape("rect", tip=tip, class_="state", x=x0, y=y + 2, width=x1 - x0, height=LANE - 4, fill=fill))
        if x1 - x0 > len(status) * CHAR + 8:
            out.append(shape("text", status, x=x0 + 4, y=y + LANE / 2 + 4, fill=ink(fill)))
    return out


def _probes(y: float, probes: list[tuple[float, float, int]], x: X) -> tuple[list[Shape], float]:
    """Probes as bars from sent to answered, stacked where they overlap; returns the lane's height."""
    rows = pack([(x(s), max(x(a), x(s) + 2)) for s, a, _ in probes], 6)
    height = max(LANE, 8 * (max(rows) + 1) + 4)
    out = _lane(y, height, "probes")
    for (sent, answered, status), row in zip(probes, rows, strict=True):
        tip = f"HTTP {status}: sent {sent:g} s, answered {answered:g} s"
        width = max(x(answered) - x(sent), 2.0)
        out.append(
            shape(
                "rect",
                tip=tip,
                class_="probe",
                x=x(sent),
                y=y + 2 + 8 * row,
                width=width,
                height=6,
                fill=probe_colour(status),
            )
        )
    return out, height


def _mark_labels(marks: list[tuple[float, str]], x: X) -> list[tuple[float, int]]:
    """Where each mark's label goes: its x, kept inside the picture, and a row of the band above
    the lanes chosen so that labels do not collide."""
    starts = [min(x(t) + 3, WIDTH - len(w) * CHAR) for t, w in marks]
    ends = [s + len(w) * CHAR + 6 for s, (_, w) in zip(starts, marks, strict=True)]
    return list(zip(starts, pack(list(zip(starts, ends, strict=True)), 3), strict=True))


def _marks(marks: list[tuple[float, str]], labels: list[tuple[float, int]], bottom: float, x: X) -> list[Shape]:
    out: list[Shape] = []
    for (t, what), (lx, row) in zip(marks, labels, strict=True):
        ly = 14 * row + 11
        out += [
            shape("line", x1=x(t), x2=x(t), y1=ly + 2, y2=bottom, stroke=MARK_COLOUR, stroke_dasharray="4 3"),
            shape("text", what, x=lx, y=ly, fill=MARK_COLOUR),
        ]
    return out


def _legend(y: float, items: list[tuple[str, str, bool]]) -> tuple[list[Shape], float]:
    """Swatches (a dot for a version, a bar otherwise) wrapped onto rows; returns the new bottom."""
    out: list[Shape] = []
    lx = float(LEFT)
    for colour, text, dot in items:
        width = 20 + len(text) * CHAR + 14
        if lx + width > WIDTH - RIGHT and lx > LEFT:
            lx, y = float(LEFT), y + 18
        if dot:
            out.append(shape("circle", cx=lx + 6, cy=y - 4, r=5, fill=colour))
        else:
            out.append(shape("rect", x=lx, y=y - 9, width=14, height=10, fill=colour))
        out.append(shape("text", text, x=lx + 18, y=y))
        lx += width
    return out, y + 10


def _legend_items(tl: Timeline, colours: dict[str | None, str]) -> list[tuple[str, str, bool]]:
    """What the picture uses: versions as dots (old and new named so), then states and probe
    answers as bars."""
    roles = {tl.old: " (old)", tl.new: " (new)"}
    items = [(c, f"{v}{roles.get(v, '')}", True) for v, c in colours.items() if v is not None]
    if any(v is None for _, v in tl.chunks):
        items.append((NONE_COLOUR, "no policy version", True))
    states = {state_colour(s, colours) for _, _, s in tl.replicas}
    codes = {probe_colour(p[2]) for p in tl.probes}
    keys = [
        (TRANSITION_COLOUR, "loading / swapping", states),
        (ERROR_STATE_COLOUR, "error", states),
        (OTHER_STATE_COLOUR, "other state", states),
        (PROBE_OK_COLOUR, "probe 200", codes),
        (PROBE_RETRY_COLOUR, "probe 425", codes),
        (PROBE_BAD_COLOUR, "probe, other status", codes),
    ]
    return items + [(c, text, False) for c, text, used in keys if c in used]


def picture(tl: Timeline) -> Picture:
    times = tl.times()
    lo, hi = min([0.0, *times]), max([0.0, *times])
    span = (hi - lo) or 1.0  # a timeline of one instant still gets an axis

    def x(t: float) -> float:
        return LEFT + (t - lo) / span * (WIDTH - LEFT - RIGHT)

    colours = version_colours(tl)
    labels = _mark_labels(tl.marks, x)
    y = 14.0 * (max((row for _, row in labels), default=-1) + 1) + 6  # below the mark labels
    shapes: list[Shape] = []
    if tl.chunks:
        shapes, y = _stream(y, tl, x, colours), y + LANE + GAP
    replicas = sorted({r[1] for r in tl.replicas})
    for i in replicas:
        changes = sorted((t, s) for t, j, s in tl.replicas if j == i)
        shapes += _lane(y, LANE, f"replica {i}") + _replica(y, changes, hi, x, colours)
        y += LANE + GAP
    if tl.probes:
        lane, height = _probes(y, tl.probes, x)
        shapes, y = shapes + lane, y + height + GAP
    shapes += _marks(tl.marks, labels, y, x) + _axis(y, lo, hi, x)
    legend, bottom = _legend(y + 44, _legend_items(tl, colours))
    caption = f"{tl.title}: {len(tl.chunks)} chunks, {len(replicas)} replicas, {len(tl.probes)} probes"
    return Picture(tl.title, WIDTH, round(bottom), shapes, legend, caption)
