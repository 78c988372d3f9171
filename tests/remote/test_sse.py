"""One SSE splitter for the client and the recorder: every legal framing, split anywhere."""

import random
import re

import pytest

from pytest_rlrollout.remote.limits import LimitExceeded
from pytest_rlrollout.remote.sse import SSEDecoder, event_data, sse_events


@pytest.mark.parametrize(
    ("reads", "events"),
    [
        ([b"data: a\n\ndata: b\n\n"], ["data: a", "data: b"]),
        ([b"data: a\r\n\r\ndata: b\r", b"\n\r\n"], ["data: a", "data: b"]),
        ([b"data: a\r\rdata: b\r\r"], ["data: a", "data: b"]),
        ([b"data: a\n", b"\ndata: b"], ["data: a"]),  # a final event without its blank line is dropped
        ([b": keep-alive\n\n", b"data: x\n\n"], ["data: x"]),
        ([b"data: \xc3", b"\xa9\n\n"], ["data: \u00e9"]),
    ],
)
def test_sse_framing(reads, events):
    assert list(sse_events(iter(reads))) == events


@pytest.mark.parametrize("framing", ["\n", "\r\n", "\r"])
def test_every_split_point_gives_the_same_events(framing):
    text = framing.join(
        ["data: a", "", ": comment", "", "event: x", "data: b1", "data: b2", "", "data: [DONE]", "", ""]
    )
    raw = text.encode()
    whole = list(sse_events([raw]))
    assert whole == ["data: a", "event: x\ndata: b1\ndata: b2", "data: [DONE]"]
    for cut in range(len(raw) + 1):
        assert list(sse_events([raw[:cut], raw[cut:]])) == whole, cut


def test_event_data_joins_data_lines():
    assert event_data("event: x\ndata: b1\ndata:b2") == "b1\nb2"


def test_decoder_keeps_no_event_until_its_blank_line():
    d = SSEDecoder()
    assert d.feed(b"data: a\r") == []  # the CR may be followed by the LF of the same line ending
    assert d.feed(b"\n") == []
    assert d.feed(b"\r\n") == ["data: a"]
    assert d.close() == []


def test_random_streams_split_anywhere_give_the_events_of_the_whole():
    """Streams of random lines (blank, comment, field; every line ending, non-ASCII text), fed
    whole and in random reads (a byte to a few KB): the same events, and the same as a plain
    reading of the SSE rules gives."""
    rng = random.Random(11)
    words = [
        b"",
        b"",
        b": ping",
        b"data: x",
        b"data: \xc3\xa9\xe2\x82\xac",
        b"event: e",
        b"id: 7",
        b":",
        b"data:" + b"y" * 3000,
    ]
    for _ in range(300):
        lines = [rng.choice(words) for _ in range(rng.randrange(1, 60))]
        ends = [rng.choice([b"\n", b"\r\n", b"\r"]) for _ in lines]
        raw = b"".join(line + end for line, end in zip(lines, ends, strict=True))
        expected, event = [], []
        for line in re.split(rb"\r\n|\r|\n", raw)[:-1]:  # the rules, read plainly (a \r then \n is one end)
            if line:
                event.append(line.decode())
            elif event:
                if not all(x.startswith(":") for x in event):
                    expected.append("\n".join(event))
                event = []
        reads, at, most = [], 0, rng.choice([1, 8, 64, 4096])
        while at < len(raw):
            size = rng.randint(0, most)  # an empty read too
            reads.append(raw[at : at + size])
            at += size
        assert list(sse_events([raw])) == expected
        assert list(sse_events(reads)) == expected, (lines, ends, reads)


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_an_event_of_exactly_max_event_bytes_passes_however_it_is_split(end):
    """An event's size is its bytes, every line end included and its blank line counted as one
    byte (the event ends there), the same whatever the reads: one byte less is refused, at
    every split point."""
    event = b"event: e" + end + b": c" + end + b"data: " + b"x" * 40 + end + end
    size = len(event) - len(end) + 1
    for cut in range(len(event) + 1):
        reads = [event[:cut], event[cut:]]
        assert list(sse_events(reads, max_event=size)) == [f"event: e\n: c\ndata: {'x' * 40}"]
        with pytest.raises(LimitExceeded, match="an SSE event passed"):
            list(sse_events(reads, max_event=size - 1))
