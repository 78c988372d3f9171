"""The API key never shows: not in a repr, a local pytest shows (`-l --tb=long`), junit XML, the
report, a cassette or the terminal, even when tests fail and their evidence is attached."""

import dataclasses
import json
import re
import secrets
import traceback

import httpx
import pytest

from pytest_rlrollout.reference import reference_deployment
from pytest_rlrollout.remote.cassette import Cassette, CassetteTransport, request_key
from pytest_rlrollout.remote.client import DeploymentClient
from pytest_rlrollout.remote.drivers.fireworks import HotLoadAPI
from pytest_rlrollout.remote.limits import LimitExceeded, Limits
from pytest_rlrollout.remote.secret import Redacted, Secret
from pytest_rlrollout.remote.stream import EXCERPT, Exchange
from pytest_rlrollout.remote.target import Target
from pytest_rlrollout.remote.transport import ExchangeFailed
from pytest_rlrollout.snapshot import tiny_moe
from pytest_rlrollout.suite.options import CONFORMANCE

from .budget import Budget


def fresh_key() -> str:
    return f"sk-test-{secrets.token_hex(12)}"


def leaks(key: str, *texts: str) -> list[str]:
    """Each text that holds the key, with a little context around the first occurrence."""
    out = []
    for text in texts:
        at = text.find(key)
        if at >= 0:
            out.append(text[max(0, at - 120) : at + len(key) + 40])
    return out


USER_TEST = """
def test_fails_inside_the_client(rl_deployment):
    def refuse(chunk):
        raise AssertionError("refused a chunk")

    rl_deployment.complete({"prompt": "hi", "max_tokens": 2, "stream": True}, on_chunk=refuse)
"""  # a user's test whose failure is raised in the client: pytest shows the client's frames


def test_a_failing_conformance_run_shows_the_key_nowhere(pytester, bucket):
    """Two modules against a reference deployment with a distinctive key and faults that fail
    an inference and a hot-load clause, with every option that shows more (locals, long
    tracebacks, junit XML, the report, a recording): the key is in none of the outputs."""
    key = fresh_key()
    base = bucket / tiny_moe.BASE_IDENTITY
    pytester.makepyfile(test_user=USER_TEST)
    with (
        Budget(
            "secrets", "failing live run with -l --tb=long, junit, report and recording", seconds=240, rss_mb=1500
        ) as budget,
        reference_deployment(bucket, api_key=key, faults={"INF-USAGE-1", "HL-POST-2"}) as dep,
    ):
        result = pytester.runpytest_inprocess(
            str(CONFORMANCE / "test_inference.py"),
            str(CONFORMANCE / "test_hot_load.py"),
            "test_user.py",
            "-p",
            "no:randomly",
            "-l",
            "--tb=long",
            "-rA",
            "--junitxml=j.xml",
            "--rl-report=r.json",
            "--rl-record=rec",
            f"--rl-deployment={dep.name}",
            f"--rl-base-url={dep.base_url}",
            f"--rl-model={dep.model}",
            f"--rl-api-key={key}",
            "--rl-allow-hot-load",
            f"--rl-bucket-url={bucket}",
            f"--rl-base-snapshot={base}",
        )
    terminal = "\n".join(result.outlines + result.errlines)
    assert result.ret == 1, terminal[-3000:]  # the faults fail their clauses
    report = json.loads((pytester.path / "r.json").read_text())
    outcomes = {c: v["outcome"] for c, v in report["clauses"].items()}
    assert outcomes["INF-USAGE-1"] == "fail" and outcomes["HL-POST-2"] == "fail", outcomes
    files = [p for p in pytester.path.rglob("*") if p.is_file() and p.suffix in {".xml", ".json", ".md", ".html"}]
    names = {p.name for p in files}
    assert {"j.xml", "r.json", "r.md", "r.html", "_session.json"} <= names, names
    assert len([p for p in files if p.parent.parent.name == "rec"]) > 10  # the recorded cassettes
    # the client's frames were shown with their locals (the auth headers among them), so an absent
    # key means it was kept out, not left unprinted
    assert re.search(r"FAILED \S*test_fails_inside_the_client", terminal), terminal[-3000:]
    assert "AssertionError: refused a chunk" in terminal  # raised from the client's frames
    assert re.search(r"sending += \{'Authorization': '<redacted>'", terminal), terminal[-3000:]
    found = {str(p.relative_to(pytester.path)): hit for p in files for hit in leaks(key, p.read_text(errors="replace"))}
    if hits := leaks(key, terminal):
        found["terminal"] = hits[0]
    assert found == {}, found
    assert budget.inputs == 1


def test_reprs_and_copies_of_a_target_hide_the_key():
    key = fresh_key()
    with Budget("secrets", "reprs and copies of a target", seconds=2, rss_mb=20, inputs=4):
        t = Target("accounts/a/deployments/d", "http://x", "m", key)
        copies = [t, dataclasses.replace(t, model="n"), dataclasses.asdict(t), dataclasses.astuple(t)]
        shown = [repr(x) for x in copies] + [str(x) for x in copies] + [repr(Secret(key)), f"{Secret(key)}"]
    assert leaks(key, *shown) == []
    assert dataclasses.replace(t).api_key.reveal() == key


def test_auth_headers_show_nothing_but_send_the_key():
    """The header values are `Redacted`: a str httpx sends as is, that never shows itself."""
    key = fresh_key()
    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        return httpx.Response(200, json={"replicas": []})

    with (
        Budget("secrets", "auth headers", seconds=5, rss_mb=50),
        DeploymentClient(
            Target("accounts/a/deployments/d", "http://x", "m", key), transport=httpx.MockTransport(answer)
        ) as c,
    ):
        headers = HotLoadAPI(c).headers()
        HotLoadAPI(c).status()
        request = c.http.build_request("GET", "http://x/", headers=headers)
    assert seen == [f"Bearer {key}"]
    assert isinstance(headers["Authorization"], Redacted)
    shown = [
        repr(headers),
        str(headers),
        f"{headers['Authorization']}",
        "%s" % headers["Authorization"],  # noqa: UP031
        repr(request),
        repr(request.headers),
        repr(c.exchanges),
        repr(c.target),
        repr(c),
    ]
    assert leaks(key, *shown) == [], shown


def test_exchanges_keep_no_key_even_cut_in_the_middle():
    """An excerpt is cut after the key is replaced: a key straddling the cut, wherever it falls,
    leaves no prefix of itself at the end."""
    key = Secret(fresh_key())
    secret = key.reveal()
    offsets = range(EXCERPT - len(secret) - 2, EXCERPT + 2)
    with Budget("secrets", "a key straddling an excerpt's cut", seconds=2, rss_mb=20, inputs=len(offsets)):
        for offset in offsets:
            body = "x" * offset + secret + "y" * 50
            e = Exchange.of("POST", "/p", 200, body, body, key)
            assert len(e.request) == EXCERPT and secret[:4] not in e.text(), offset
            assert not any(e.request.endswith(secret[:i]) for i in range(1, len(secret))), (offset, e.request[-30:])


def failing(kind: str):
    """A transport that fails the way `kind` says, after the request (with its auth) was built."""

    def handle(request: httpx.Request) -> httpx.Response:
        sent = str.__str__(request.headers["authorization"])  # a transport that quotes what it was sent
        if kind == "connect":
            raise httpx.ConnectError(f"connection refused ({sent})", request=request)
        if kind == "protocol":
            raise httpx.RemoteProtocolError(f"illegal header line after {sent}", request=request)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=b"data: {}\n" * 64)

    return httpx.MockTransport(handle)


@pytest.mark.parametrize("kind", ["connect", "protocol", "limit"])
def test_a_failed_exchange_shows_no_key_in_a_long_traceback_with_locals(kind, tmp_path):
    """What pytest -l --tb=long would print: every frame's locals below the test down to the raise
    (a transport error quoting the auth header it sent included); and the key is not in the
    cassette written after."""
    key = fresh_key()
    cassette = Cassette(tmp_path / "c.json")
    recorder = CassetteTransport("record", Secret(key), tmp_path, cassette, inner=failing(kind))
    limits = Limits(event=100)
    c = DeploymentClient(Target("accounts/a/deployments/d", "http://x", "m", key), transport=recorder, limits=limits)
    expected = LimitExceeded if kind == "limit" else ExchangeFailed
    with Budget("secrets", f"traceback locals: {kind}", seconds=5, rss_mb=50), pytest.raises(expected) as info:
        c.complete({"prompt": "hi", "stream": True}, headers={"x-api-key": Redacted(key)})
    # the frames below this test's own (which holds the key to look for it)
    below = traceback.StackSummary.extract(traceback.walk_tb(info.value.__traceback__.tb_next), capture_locals=True)
    frames = below.format()
    cassette.write(Secret(key))
    shown = "".join(frames) + (tmp_path / "c.json").read_text() + repr(info.value) + "\n".join(map(repr, c.exchanges))
    assert "sending = {'Authorization': '<redacted>'" in shown  # the client's frame, its locals shown
    assert leaks(key, shown) == []


def test_a_request_key_never_holds_the_key():
    key = Secret(fresh_key())
    with Budget("secrets", "a cassette's request key", seconds=2, rss_mb=20):
        request = httpx.Request(
            "POST", "http://x/v1", headers={"Authorization": f"Bearer {key.reveal()}"}, json={"prompt": key.reveal()}
        )
        matched = request_key(request, key)
    assert key.reveal() not in matched and '"key"' in matched and "<scrubbed>" in matched


def echoing(request: httpx.Request) -> httpx.Response:
    """A deployment that echoes the request's Authorization back: in a header, in the body, in
    events that do and do not parse, in an error."""
    sent = str.__str__(request.headers["authorization"])
    echo = {"x-echo": sent, "content-type": "text/event-stream"}
    if request.url.path.endswith("/hot_load"):
        return httpx.Response(401, headers={"x-echo": sent}, json={"error": f"bad key {sent}"})
    asked = json.loads(request.content)
    if not asked.get("stream"):
        return httpx.Response(200, headers={"x-echo": sent}, text=f"not json: {sent}")
    if asked["prompt"] == "refuse":
        return httpx.Response(500, headers=echo, text=f"error for {sent}")
    events = [f'data: {{"choices": [{{"text": "{sent}"}}]}}\n\n', f"data: {sent}\n\n", "data: [DONE]\n\n"]
    return httpx.Response(200, headers=echo, text="".join(events))


def test_a_deployment_that_echoes_the_key_never_gets_it_shown():
    """What the client keeps of an answer (a response's text and headers, a stream's body,
    headers, events, chunks and problems, the exchanges) has the key replaced: a verdict that
    shows any of it shows no key."""
    key = fresh_key()
    target = Target(None, "http://x", "m", key, engine="openai")
    with (
        Budget("secrets", "a deployment that echoes the key", seconds=5, rss_mb=50, inputs=4),
        DeploymentClient(target, transport=httpx.MockTransport(echoing)) as c,
    ):
        status = HotLoadAPI(c).status()
        answers = [
            c.complete({"prompt": "hi"}),
            c.complete({"prompt": "hi", "stream": True}),
            c.complete({"prompt": "refuse", "stream": True}),
        ]
        exchanges = "\n".join(e.text() for e in c.exchanges)
    assert status.status_code == 401 and status.json()["error"] == "bad key Bearer <key>"
    assert answers[1].chunks[0]["choices"][0]["text"] == "Bearer <key>" and answers[2].status == 500
    shown = [status.text, repr(status.headers), exchanges, *(repr(vars(s)) for s in answers)]
    assert all("<key>" in text for text in shown[:3]), shown
    assert leaks(key, *shown) == [], shown
