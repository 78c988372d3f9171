"""One SSE splitter for the client and the recorder: every legal framing, split anywhere."""

import pytest

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
