"""The reference deployment under hostile input (issue 11). Whatever a client sends, it gets a 4xx
with a JSON error (never a 5xx) in bounded time and memory, on a connection that carries its next
request; the event loop stays free for every other client while the server reads, decodes,
tokenizes or validates; a refused request harms no other client's stream; and a request that
fails inside a decode step ends alone, its batch going on without it.

Every input runs against one in-process deployment on loopback, under a `Budget` (time and RSS)
and while a probe polls the hot-load status (which must answer within PROBE_SECONDS)."""

from __future__ import annotations

import array
import fcntl
import itertools
import json
import os
import shutil
import signal
import socket
import termios
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest

from pytest_rlrollout.contract.schemas import is_valid, schema
from pytest_rlrollout.reference import reference_deployment, replica, validator
from pytest_rlrollout.reference.controller import HINT_REFUSAL
from pytest_rlrollout.reference.model import Model
from pytest_rlrollout.reference.settings import Settings
from pytest_rlrollout.reference.text import Text
from pytest_rlrollout.remote.polling import wait_until
from pytest_rlrollout.snapshot import tiny_moe

from .budget import Budget

DEFAULTS = Settings(bucket=Path("."))
MODEL = DEFAULTS.deployment  # the module's deployment runs with the default names
LIMIT = DEFAULTS.max_body_bytes  # the documented body limit, tested at its default
BODY_TIMEOUT = 1.0  # the module's deployment waits this long for a body (default: 30 s)
PROBE_SECONDS = 1.0  # the most any probe may wait while a hostile request is being handled
SECONDS, RSS_MB = 3.0, 64  # the budget of one hostile request
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
HOT_LOAD, HINT = "/hot_load/v1/models/hot_load", "/hot_load/v1/models/hot_load/hint"


# --------------------------------------------------------------------------- the deployment


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    bucket = tmp_path_factory.mktemp("hostile") / "bucket"
    tiny_moe.make_base(bucket / tiny_moe.BASE_IDENTITY)
    (bucket / "escape").symlink_to("/etc")  # a directory of the bucket that leads out of it
    # decode steps slowed a little, so a victim's stream is still running when hostile requests land
    with reference_deployment(bucket, token_delay=0.002, body_timeout=BODY_TIMEOUT) as running:
        with httpx.Client(base_url=running.base_url, headers=auth(running), timeout=30) as c:
            # first uses compile schemas and templates and import modules: not a cost of any case
            for path, body in (
                (COMPLETIONS, {"model": MODEL, "prompt": 5}),
                (CHAT, {"model": MODEL, "messages": []}),
                (CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
            ):
                c.post(path, json=body)
        yield running


def auth(dep) -> dict[str, str]:
    return {"Authorization": f"Bearer {dep.api_key}"}


def headers_for(dep, path: str) -> dict[str, str]:
    return dep.hot_load_headers() if path.startswith("/hot_load") else auth(dep) | {"Content-Type": "application/json"}


def completion(prompt: object = "hello", **fields: object) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 2, **fields}


def chat(messages: object, **fields: object) -> dict:
    return {"model": MODEL, "messages": messages, "max_tokens": 2, **fields}


def encoded(doc: object) -> bytes:
    """JSON text as a client may send it: NaN and Infinity included, lone surrogates escaped."""
    return json.dumps(doc, allow_nan=True).encode()


# --------------------------------------------------------------------------- probes and victims


class Probe:
    """Polls the hot-load status on a thread of its own while a hostile request is handled; each
    answer must come within PROBE_SECONDS (the event loop is not held up). At least one probe
    completes, after the block if the block was quicker."""

    def __init__(self, dep):
        self.dep = dep
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._failure: BaseException | None = None

    def __enter__(self) -> Probe:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            with httpx.Client(base_url=self.dep.base_url, timeout=30) as c:
                while True:
                    t = time.monotonic()
                    r = c.get(HOT_LOAD, headers=self.dep.hot_load_headers())
                    self.latencies.append(time.monotonic() - t)
                    assert r.status_code == 200, r.text
                    if self._stop.wait(0.01):
                        return
        except BaseException as e:  # re-raised on the test's thread
            self._failure = e

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        if exc[0] is None:
            assert self._failure is None, self._failure
            assert self.latencies and max(self.latencies) <= PROBE_SECONDS, (
                f"a probe waited {max(self.latencies):.2f} s"
            )


class Victim:
    """A well-behaved streamed completion read on a thread of its own: it must get every token it
    asked for, then the final chunk and [DONE], whatever else the deployment is handling."""

    def __init__(self, dep, max_tokens: int = 300, session: str | None = None, **fields: object):
        self.max_tokens = max_tokens
        self.body = {
            "model": MODEL,
            "prompt": "a victim's prompt",
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": True,
            "stream": True,
            **fields,
        }
        self.headers = auth(dep) | ({"x-session-affinity": session} if session else {})
        self.dep = dep
        self.status: int | None = None
        self.tokens = 0
        self.arrivals: list[float] = []
        self.finish: str | None = None
        self.error: dict | None = None
        self.done = False
        self.failure: BaseException | None = None
        self.streaming = threading.Event()  # the first token arrived
        self.ended = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            with (
                httpx.Client(base_url=self.dep.base_url, timeout=60) as c,
                c.stream("POST", COMPLETIONS, json=self.body, headers=self.headers) as r,
            ):
                self.status = r.status_code
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        self.done = True
                        break
                    doc = json.loads(line[6:])
                    if "error" in doc:
                        self.error = doc["error"]
                        break
                    self.arrivals.append(time.monotonic())
                    choice = doc["choices"][0]
                    self.tokens += len((choice.get("logprobs") or {}).get("content") or [])
                    self.finish = choice["finish_reason"] or self.finish
                    if self.tokens:
                        self.streaming.set()
        except BaseException as e:  # reported by whole()
            self.failure = e
        finally:
            self.streaming.set()
            self.ended.set()

    def wait_streaming(self) -> None:
        assert self.streaming.wait(30) and not self.ended.is_set(), self.report()

    def whole(self) -> None:
        assert self.ended.wait(120), "the victim's stream never ended"
        assert (self.failure, self.status, self.error) == (None, 200, None), self.report()
        assert (self.tokens, self.finish, self.done) == (self.max_tokens, "length", True), self.report()

    def report(self) -> str:
        return (
            f"status {self.status}, {self.tokens}/{self.max_tokens} tokens, finish {self.finish}, "
            f"[DONE] {self.done}, error {self.error}, failure {self.failure!r}"
        )


# --------------------------------------------------------------------------- the corpus


@dataclass(frozen=True)
class Case:
    """One hostile request: `body` is the bytes sent (or makes them: big bodies are built when the
    case runs, not when the module is collected)."""

    name: str
    path: str
    body: bytes | Callable[[], bytes]
    expect: frozenset[int]
    headers: tuple[tuple[str, str], ...] = ()

    def content(self) -> bytes:
        return self.body() if callable(self.body) else self.body


def case(name: str, path: str, body: object, expect: int | set[int] = 400, headers: dict | None = None) -> Case:
    raw = body if isinstance(body, bytes) or callable(body) else encoded(body)
    codes = frozenset(expect if isinstance(expect, set) else {expect})
    return Case(name, path, raw, codes, tuple((headers or {}).items()))


def brief(value: object) -> str:
    text = repr(value)
    if len(text) <= 24:
        return text
    return text[:20] + (f"... ({len(value)})" if isinstance(value, str | list | dict) else "...")


# A value of every JSON type: each field of the request schemas gets each one its schema refuses
# (the schema judges which, so the cases follow it when it changes); ranges are parameters()'s.
WRONG = [{}, [], "text", 1.5, True, [None]]


def schema_fields(name: str) -> list[str]:
    s = schema(name)
    fields = set(s.get("properties", {}))
    for part in s.get("allOf", []):
        fields |= set(part.get("properties", {}))
    return sorted(fields)


def wrong_types() -> Iterator[Case]:
    for name, path, base in (
        ("completion-request", COMPLETIONS, completion()),
        ("chat-completion-request", CHAT, chat([{"role": "user", "content": "hi"}])),
    ):
        for field in schema_fields(name):
            for value in WRONG:
                body = base | {field: value}
                if not is_valid(name, body):
                    yield case(f"{path} {field}={brief(value)}", path, body)


def parameters() -> Iterator[Case]:
    """Values of the right type out of range: each is a 400 before the request reaches a replica."""
    out_of_range = {
        "top_k": [10**30, 1048577, -1, 2**63],
        "temperature": [5e-324, 1e-4, -0.5, 2.0001, 1e308],
        "top_p": [0, -1e-300, 1.0000001],
        "seed": [-1, 2**63, 2**64, 10**30],
        "n": [2, 0, 10**9, -1],
        "max_tokens": [-1, 2**31, 10**30, 2048, 5000],
        "logprobs": [21, -1, 10**30],
        "echo_last": [-1, 2**31],
        "prompt_cache_max_len": [-1, 10**20],
        "stop": [["a"] * 17, ["a"] * 100_000, "", "x" * 257, [""], ["x" * 257]],
        "model": ["x" * 513],
        "prompt_cache_isolation_key": ["k" * 257],
    }
    for field, values in out_of_range.items():
        for value in values:
            yield case(f"completion {field}={brief(value)}", COMPLETIONS, completion(**{field: value}))
    prompts = [
        "",
        [],
        [-1],
        [10**30],
        [2**31],
        [1.5],
        ["a"],
        [None],
        [1] * 2049,
        [1] * 131_073,
        "x" * 1_000_000,
        "\U0001f600" * 26_000,
        "ab " * 8_000,
    ]
    for prompt in prompts:
        yield case(f"completion prompt={brief(prompt)}", COMPLETIONS, completion(prompt))
    yield case("completion prompt of token ids past the vocabulary", COMPLETIONS, completion([1, 2, 10**6]))
    yield case("completion model not served", COMPLETIONS, completion(model="accounts/x/models/y"), 404)
    yield case("completion routing_matrix_format", COMPLETIONS, completion(routing_matrix_format="parquet_v1"))
    for value in ("nan", "-1", "inf", "1e999", "soon", "-0.5"):
        yield case(
            f"drain timeout header {value}",
            COMPLETIONS,
            completion(),
            400,
            {"x-fireworks-hot-load-drain-timeout": value},
        )


def messages() -> Iterator[Case]:
    user = {"role": "user", "content": "hi"}
    broken = {
        "none": [],
        "a dict": user,
        "a string": "hello",
        "strings": ["hello"],
        "no role": [{"content": "hi"}],
        "no content": [{"role": "user"}],
        "role 5": [{"role": 5, "content": "hi"}],
        "content 5": [{"role": "user", "content": 5}],
        "content null": [{"role": "user", "content": None}],
        "content parts": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "role of 65 characters": [{"role": "r" * 65, "content": "hi"}],
        "4097 messages": [user] * 4097,
        "30,000 messages": [{"role": "", "content": ""}] * 30_000,
        "a conversation longer than the context": [{"role": "user", "content": "x" * 30_000}],
        "4096 empty messages": [{"role": "user", "content": ""}] * 4096,
        "a lone surrogate in content": [{"role": "user", "content": "\udcff"}],
    }
    for name, value in broken.items():
        yield case(f"chat messages: {name}", CHAT, chat(value))


def bodies() -> Iterator[Case]:
    """What is not a JSON object of valid UTF-8 at all, sent to every endpoint that takes a body."""
    valid = encoded(completion())
    raw = {
        "empty": b"",
        "a space": b" ",
        "null": b"null",
        "a list": b"[]",
        "a number": b"1",
        "a string": b'"s"',
        "truncated": valid[:-3],
        "a trailing comma": b'{"model": "a",}',
        "trailing garbage": valid + b" x",
        "NUL bytes": b"\x00" * 64,
        "UTF-16": json.dumps(completion()).encode("utf-16"),
        "invalid UTF-8": valid.replace(b"hello", b"\xff\xfe"),
        "overlong UTF-8": valid.replace(b"hello", b"\xc0\xaf"),
        "a lone surrogate": valid.replace(b"hello", b"\\udcff"),
        "nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
        "objects nested 50,000 deep": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        "stop nested 990 deep": valid[:-1] + b', "stop": ' + b"[" * 990 + b"]" * 990 + b"}",
        "NaN": valid[:-1] + b', "temperature": NaN}',
        "Infinity": valid[:-1] + b', "top_p": Infinity}',
        "-Infinity": valid[:-1] + b', "temperature": -Infinity}',
        "1e999": valid[:-1] + b', "max_tokens": 1e999}',
        "NaN token id": encoded(completion()).replace(b'"hello"', b"[1, NaN]"),
        "a 5,000-digit integer": valid[:-1] + b', "seed": ' + b"9" * 5000 + b"}",
    }
    for name, content in raw.items():
        for path in (COMPLETIONS, CHAT, HOT_LOAD, HINT):
            yield case(f"{path} body {name}", path, content)
    for media in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "text/xml"):
        for path in (COMPLETIONS, HOT_LOAD):
            yield case(f"{path} content-type {media}", path, valid, 415, {"Content-Type": media})


def oversized() -> Iterator[Case]:
    """Bodies past the limit (413), whatever they would have held."""
    big = {
        "a prompt of 2 MiB": lambda: encoded(completion("x" * (2 << 20))),
        "a logit_bias of 100,000 tokens": lambda: encoded(completion(logit_bias={str(i): 100 for i in range(100_000)})),
        "300,000 messages": lambda: encoded(chat([{"role": "user", "content": "hi"}] * 300_000)),
        "a stop list of 300,000": lambda: encoded(completion(stop=["s"] * 300_000)),
        "48 MB of prompt": lambda: encoded(completion("x" * 48_000_000)),
    }
    for name, make in big.items():
        yield case(f"oversized: {name}", CHAT if "messages" in name else COMPLETIONS, make, 413)
    yield case("oversized: a hot-load signal of 2 MiB", HOT_LOAD, lambda: encoded({"identity": "x" * (2 << 20)}), 413)


def signals() -> Iterator[Case]:
    identities = [
        "a" * 256,
        "\u00e9" * 128,
        "/etc",
        "../../../../etc",
        "..",
        ".",
        "",
        "a\x00b",
        "a\nb",
        "a\\b",
        "a\x7f",
        "escape",
        "missing",
        5,
        None,
        [],
        {},
        True,
        "x" * 100_000,
    ]
    for identity in identities:
        yield case(f"signal identity={brief(identity)}", HOT_LOAD, {"identity": identity})
    yield case("signal identity lone surrogate", HOT_LOAD, b'{"identity": "\\udcff"}')
    for name, body in {
        "an unknown field": {"identity": "x", "extra": 1},
        "reset_prompt_cache bogus": {"identity": "x", "reset_prompt_cache": "bogus"},
        "reset_prompt_cache 5": {"identity": "x", "reset_prompt_cache": 5},
        "metadata 5": {"identity": "x", "incremental_snapshot_metadata": 5},
        "metadata a list": {"identity": "x", "incremental_snapshot_metadata": []},
        "metadata out of the bucket": {
            "identity": "x",
            "incremental_snapshot_metadata": {"previous_snapshot_identity": "../x"},
        },
        "validation 5": {"identity": "x", "validation": 5},
    }.items():
        yield case(f"signal {name}", HOT_LOAD, body)


def hints() -> Iterator[Case]:
    pairs = [
        ("/etc", "shadow"),
        ("/etc", "no-such-file"),
        ("../../../../etc", "passwd"),
        ("..", "x"),
        (".", "config.json"),
        ("escape", "passwd"),
        ("escape", "no-such-file"),
        ("a" * 300, "x"),
        ("", "x"),
        ("a\x00b", "x"),
    ]
    for identity, file in pairs:
        yield case(f"hint {identity[:20]!r} {file!r}", HINT, {"identity": identity, "file": file})
    # a name the bucket could hold: looked up (inside the bucket only), and not there
    yield case("hint 'missing' 'config.json'", HINT, {"identity": "missing", "file": "config.json"}, 404)
    for name, body in {
        "identity 5": {"identity": 5, "file": "x"},
        "no file": {"identity": "x"},
        "a list": [],
        "an unknown field": {"identity": tiny_moe.BASE_IDENTITY, "file": "config.json", "x": 1},
    }.items():
        yield case(f"hint {name}", HINT, body)
    yield case("hint identity lone surrogate", HINT, b'{"identity": "\\udcff", "file": "x"}')
    for file in ("../../../../etc/passwd", "/etc/passwd", "a" * 300, "x\x00y", "..", ""):
        yield case(f"hint file {file[:20]!r}", HINT, {"identity": tiny_moe.BASE_IDENTITY, "file": file}, 404)


CORPUS = [*wrong_types(), *parameters(), *messages(), *bodies(), *oversized(), *signals(), *hints()]


def send(dep, c: Case, client: httpx.Client | None = None) -> httpx.Response:
    headers = headers_for(dep, c.path) | dict(c.headers)
    if client is not None:
        return client.post(c.path, content=c.content(), headers=headers)
    with httpx.Client(base_url=dep.base_url, timeout=60) as http:
        return http.post(c.path, content=c.content(), headers=headers)


def refused(r: httpx.Response, c: Case) -> None:
    assert r.status_code in c.expect, (c.name, r.status_code, r.text[:300])
    assert isinstance(r.json()["error"]["message"], str), r.text[:300]


def test_the_corpus_is_hundreds_of_distinct_inputs():
    names = [c.name for c in CORPUS]
    assert len(names) == len(set(names)) and len(names) >= 200, len(names)


@pytest.mark.parametrize("c", CORPUS, ids=lambda c: c.name[:80])
def test_every_hostile_input_is_a_4xx_in_bounded_time_and_memory(dep, c):
    content = c.content()  # built before the budget: the client's copy is not the server's cost
    headers = headers_for(dep, c.path) | dict(c.headers)
    with (
        httpx.Client(base_url=dep.base_url, timeout=60) as http,
        Probe(dep),
        Budget("reference", c.name, seconds=SECONDS, rss_mb=RSS_MB),
    ):
        r = http.post(c.path, content=content, headers=headers)
    refused(r, c)


def test_victims_stream_on_through_the_whole_corpus(dep):
    """Every input of the corpus from four clients at once, while two victims stream on the replicas
    the inputs are routed to (session affinity): each victim gets every token."""
    victims = [Victim(dep, max_tokens=400, session=f"corpus-{i}") for i in range(2)]
    for v in victims:
        v.wait_streaming()
    small = [c for c in CORPUS if "oversized" not in c.name]
    failures: list[str] = []

    def feed(part: list[Case], session: str) -> None:
        with httpx.Client(base_url=dep.base_url, timeout=60, headers={"x-session-affinity": session}) as http:
            for c in part:
                r = send(dep, c, http)
                if r.status_code not in c.expect:
                    failures.append(f"{c.name}: {r.status_code}")

    with Budget("reference", "the corpus from 4 clients beside 2 victims", seconds=60, rss_mb=200, inputs=len(small)):
        threads = [threading.Thread(target=feed, args=(small[i::4], f"corpus-{i % 2}")) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not failures, failures
    for v in victims:
        v.whole()


# --------------------------------------------------------------------------- one request fails alone


def test_bad_parameters_are_refused_while_a_victim_in_the_same_batch_streams_on(dep):
    """The first report: top_k 1000000 or temperature 5e-324 in a victim's batch ended its stream with
    a 500 after 55 chunks. Out-of-range values are now a 400 up front; values at the very edge of
    their range are served in the victim's batch, and the victim gets every token."""
    session = "batch-mates"
    victim = Victim(dep, session=session, temperature=1.0, seed=7)
    victim.wait_streaming()
    affinity = {"x-session-affinity": session}
    with httpx.Client(base_url=dep.base_url, headers=auth(dep) | affinity, timeout=30) as http:
        for bad in ({"top_k": 10**30}, {"temperature": 5e-324}, {"seed": -1}, {"top_k": 10**6 + 2**20}, {"n": 10**9}):
            r = http.post(COMPLETIONS, json=completion(**bad))
            assert r.status_code == 400, (bad, r.text)
        edges = [
            {"top_k": 1_000_000, "temperature": 1},
            {"top_k": 1048576, "temperature": 2},
            {"temperature": 0.001},
            {"top_p": 5e-324, "temperature": 1},
            {"seed": 2**63 - 1, "temperature": 1},
            {"top_k": 1, "temperature": 1},
        ]
        mates = [Victim(dep, max_tokens=16, session=session, **edge) for edge in edges]
        for mate in mates:
            mate.whole()
    assert (victim.error, victim.failure) == (None, None), victim.report()
    assert not victim.ended.is_set(), "the victim ended before its batch-mates: the test proved nothing"
    victim.whole()


def ends_alone(doomed: Victim, victim: Victim, failure: str) -> None:
    """`doomed` ends with `failure` after its first tokens; `victim`, in the same batch, goes on whole."""
    assert doomed.ended.wait(30)
    assert doomed.tokens == 4 and not doomed.done, doomed.report()
    assert failure in doomed.error["message"], doomed.report()
    assert (victim.error, victim.failure) == (None, None), victim.report()
    assert not victim.ended.is_set(), "the victim ended before the failure: the test proved nothing"
    victim.whole()


def test_a_sequence_whose_sampling_fails_ends_alone(dep, monkeypatch):
    """A failure while sampling one request's token (forced here) ends that request with an error
    event; the victim sampled in the same step streams on."""
    real = replica.sample
    calls: dict[int, int] = {}

    def failing(logits, params, rng):
        if params.top_p == 0.123:  # the doomed request's marker
            calls[id(params)] = calls.get(id(params), 0) + 1
            if calls[id(params)] == 5:
                raise RuntimeError("injected sampling failure")
        return real(logits, params, rng)

    monkeypatch.setattr(replica, "sample", failing)
    session = "sampling-fails"
    victim = Victim(dep, session=session, temperature=1.0, top_p=0.9, seed=3)
    victim.wait_streaming()
    doomed = Victim(dep, max_tokens=50, session=session, temperature=1.0, top_p=0.123, seed=4)
    ends_alone(doomed, victim, "injected sampling failure")


def test_a_sequence_whose_forward_pass_fails_ends_alone(dep, monkeypatch):
    """A batched forward step that fails (forced here, for one sequence) is retried one sequence at
    a time: only the sequence that fails alone ends; every other request of the batch goes on."""
    real = Model.step
    doomed_prompt = [5, 6, 7, 8, 9, 5, 6, 7]
    doomed_seqs: set[int] = set()

    def failing(self, seqs, tokens, lora=None):
        for seq, fed in zip(seqs, tokens, strict=True):
            if list(fed) == doomed_prompt:
                doomed_seqs.add(id(seq))
            elif id(seq) in doomed_seqs and seq.length >= len(doomed_prompt) + 3:
                raise FloatingPointError("injected forward failure")
        return real(self, seqs, tokens, lora)

    monkeypatch.setattr(Model, "step", failing)
    session = "forward-fails"
    victim = Victim(dep, session=session)
    victim.wait_streaming()
    doomed = Victim(dep, max_tokens=50, session=session, prompt=doomed_prompt)
    ends_alone(doomed, victim, "injected forward failure")


def test_eight_victims_get_every_chunk_under_hostile_load(dep):
    """Eight well-behaved streams on both replicas while three clients send bad parameters,
    oversized bodies and huge prompts at the same replicas until the streams end: no victim
    ends early and each gets every token (correctness, not timing: bench_hostile.py times it)."""
    victims = [Victim(dep, max_tokens=200, session=f"load-{i % 2}") for i in range(8)]
    for v in victims:
        v.wait_streaming()
    hostile = [c for c in CORPUS if c.path in (COMPLETIONS, CHAT) and "nested" not in c.name]
    hostile = [c for c in hostile if "oversized" not in c.name or "48 MB" not in c.name]
    sent = [0]
    wrong: list[str] = []

    def attack(i: int) -> None:
        with httpx.Client(base_url=dep.base_url, timeout=60, headers={"x-session-affinity": f"load-{i % 2}"}) as h:
            for c in itertools.cycle(hostile[i::3]):
                if all(v.ended.is_set() for v in victims):
                    return
                r = send(dep, c, h)
                sent[0] += 1
                if r.status_code not in c.expect:
                    wrong.append(f"{c.name}: {r.status_code}")

    threads = [threading.Thread(target=attack, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not wrong, wrong
    assert sent[0] >= 30, f"only {sent[0]} hostile requests landed while the victims streamed"
    for v in victims:
        v.whole()


# --------------------------------------------------------------------------- big requests


def test_a_text_too_long_for_the_context_is_refused_without_tokenizing(dep, monkeypatch):
    """The report: a 48 MB prompt was tokenized (58 s, 5.8 GB) before the context check. A text of
    more UTF-8 bytes than the context times the longest token's bytes cannot fit: refused as is.
    A shorter text is tokenized (on a worker thread) and refused for what it tokenizes to."""
    encoded_texts: list[int] = []
    real = Text.encode
    monkeypatch.setattr(Text, "encode", lambda self, text: encoded_texts.append(len(text)) or real(self, text))
    with httpx.Client(base_url=dep.base_url, headers=auth(dep), timeout=30) as http:
        for prompt in ("x" * 1_000_000, "\U0001f600" * 26_000, "\u00e9" * 20_000):
            r = http.post(COMPLETIONS, json=completion(prompt))
            assert r.status_code == 400 and "cannot fit the context length" in r.text, r.text[:300]
        long_chat = chat([{"role": "user", "content": "\u00e9" * 7_000}] * 2)
        assert http.post(CHAT, json=long_chat).status_code == 400
        assert encoded_texts == []
        r = http.post(COMPLETIONS, json=completion("ab " * 8_000))
        assert r.status_code == 400 and "exceeds the context length" in r.text, r.text[:300]
    assert encoded_texts == [24_000]


def raw_request(dep, head: bytes, body: bytes = b"") -> socket.socket:
    host, port = dep.base_url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(head + body)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of the one response on `sock` (Content-Length framed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before a response: {data[:200]!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def post_head(dep, path: str, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {dep.api_key}\r\n"
        f"Content-Type: application/json\r\n{extra}\r\n"
    ).encode("latin-1")


def test_a_declared_length_past_the_limit_is_refused_before_the_body(dep):
    """413 on the headers alone: the client need not send 50 MB to learn they will not be read."""
    with Probe(dep), Budget("reference", "Content-Length: 50 MB, no body sent", seconds=SECONDS, rss_mb=RSS_MB):
        sock = raw_request(dep, post_head(dep, COMPLETIONS, "Content-Length: 50000000\r\n"))
        with sock:
            status, headers, body = read_response(sock)
    assert status == 413 and headers.get("connection") == "close", (status, headers)
    assert str(LIMIT) in json.loads(body)["error"]["message"]


def test_a_chunked_body_past_the_limit_is_refused_as_it_grows(dep):
    """No Content-Length: the body is counted as it arrives and refused once past the limit."""
    sent = [0]

    def endless() -> Iterator[bytes]:
        yield b'{"model": "' + MODEL.encode() + b'", "prompt": "'
        while sent[0] < 64 * LIMIT:  # far past the limit: the server stops reading long before
            sent[0] += 65536
            yield b"x" * 65536

    with Probe(dep), Budget("reference", "chunked body without end", seconds=SECONDS, rss_mb=RSS_MB):
        r = httpx.post(dep.base_url + COMPLETIONS, content=endless(), headers=headers_for(dep, COMPLETIONS))
    assert r.status_code == 413 and r.headers["connection"] == "close", r.text
    assert sent[0] < 64 * LIMIT, "the whole body was read"


def test_a_body_that_stops_arriving_is_a_408_after_the_body_timeout(dep):
    with Probe(dep), Budget("reference", "a body that stops half-way", seconds=BODY_TIMEOUT + 2, rss_mb=RSS_MB):
        sock = raw_request(dep, post_head(dep, COMPLETIONS, "Content-Length: 1000\r\n"), b'{"model": ')
        with sock:
            status, headers, _ = read_response(sock)
    assert status == 408 and headers.get("connection") == "close"


def test_slow_loris_connections_hold_up_no_one(dep):
    """64 connections that send their headers a few bytes at a time and never finish them: the
    server serves everyone else as before, and a completion still streams in full."""
    head = post_head(dep, COMPLETIONS)
    socks = [raw_request(dep, head[:10]) for _ in range(64)]
    try:
        with Probe(dep), Budget("reference", "64 slow-loris connections", seconds=10, rss_mb=RSS_MB, inputs=64):
            for i in range(10, 40, 5):
                for s in socks:
                    s.sendall(head[i : i + 5])
            victim = Victim(dep, max_tokens=32)
            victim.whole()
    finally:
        for s in socks:
            s.close()


def test_a_body_cut_short_by_the_client_costs_nothing(dep):
    """A client that declares a body and closes the connection half-way: nothing to answer, and the
    deployment goes on serving."""
    with Probe(dep), Budget("reference", "a body cut short", seconds=SECONDS, rss_mb=RSS_MB, inputs=16):
        for _ in range(16):
            raw_request(dep, post_head(dep, COMPLETIONS, "Content-Length: 5000\r\n"), b'{"model":').close()
        r = httpx.post(dep.base_url + COMPLETIONS, json=completion(), headers=auth(dep))
    assert r.status_code == 200, r.text


HUGE_HEADERS = {
    "a header of 300 KB": "x-big: " + "a" * 300_000 + "\r\n",
    "5000 headers": "".join(f"x-h{i}: v\r\n" for i in range(5000)),
}


@pytest.mark.parametrize("name", sorted(HUGE_HEADERS))
def test_huge_headers_are_refused(dep, name):
    """Headers past the limit: 431 from the deployment, or 400 from the HTTP layer when they did not
    arrive whole within its read buffer; the connection is closed either way."""
    body = encoded(completion())
    head = post_head(dep, COMPLETIONS, HUGE_HEADERS[name] + f"Content-Length: {len(body)}\r\n")
    with (
        Probe(dep),
        Budget("reference", f"headers: {name}", seconds=SECONDS, rss_mb=RSS_MB),
        raw_request(dep, head, body) as sock,
    ):
        status, headers, _ = read_response(sock)
    assert status in (400, 431) and headers.get("connection") == "close", (status, headers)


def test_a_header_of_latin_1_bytes_is_echoed_back(dep):
    """Bytes 0x80-0xff are legal in a header value (obs-text); x-request-id is echoed byte for byte."""
    body = encoded(completion())
    with raw_request(
        dep, post_head(dep, COMPLETIONS, f"x-request-id: \xff\xfe\x80\r\nContent-Length: {len(body)}\r\n"), body
    ) as sock:
        status, headers, _ = read_response(sock)
    assert status == 200 and headers["x-request-id"] == "\xff\xfe\x80", (status, headers)


# --------------------------------------------------------------------------- keep-alive


KEEP_ALIVE = [
    ("schema", COMPLETIONS, encoded(completion(seed=-1)), 400),
    ("top_k", COMPLETIONS, encoded(completion(top_k=10**30)), 400),
    ("model", COMPLETIONS, encoded(completion(model="nope")), 404),
    ("not JSON", COMPLETIONS, b"{nope", 400),
    ("lone surrogate", COMPLETIONS, encoded(completion("\udcff")), 400),
    ("content-type", COMPLETIONS, b"prompt=hi", 415),
    ("long identity", HOT_LOAD, encoded({"identity": "a" * 256}), 400),
    ("surrogate identity", HOT_LOAD, b'{"identity": "\\udcff"}', 400),
    ("hint /etc", HINT, encoded({"identity": "/etc", "file": "shadow"}), 400),
    ("hint 404", HINT, encoded({"identity": tiny_moe.BASE_IDENTITY, "file": "nope"}), 404),
    ("no API key", COMPLETIONS, encoded(completion()), 401),
    ("unknown path", "/v1/nope", b"{}", 404),
]


@pytest.mark.parametrize(("name", "path", "body", "status"), KEEP_ALIVE, ids=[k[0] for k in KEEP_ALIVE])
def test_a_4xx_keeps_the_connection(dep, name, path, body, status):
    """After a 4xx, the same connection (the same local port) carries the next request: a 500 used to
    reset it."""
    with httpx.Client(base_url=dep.base_url, timeout=30) as http:
        headers = headers_for(dep, path) | (
            {"Content-Type": "application/x-www-form-urlencoded"} if status == 415 else {}
        )
        if status == 401:
            headers.pop("Authorization")
        with Budget("reference", f"keep-alive after {name}", seconds=SECONDS, rss_mb=RSS_MB):
            r = http.post(path, content=body, headers=headers)
            assert r.status_code == status, r.text
            assert r.headers.get("connection") != "close"
            first = r.extensions["network_stream"].get_extra_info("client_addr")
            ok = http.post(COMPLETIONS, json=completion(), headers=auth(dep))
            assert ok.status_code == 200, ok.text
            assert ok.extensions["network_stream"].get_extra_info("client_addr") == first


def test_an_internal_error_keeps_the_connection(dep, monkeypatch):
    """A bug (forced here) is a 500 with a JSON error, and the connection carries the next request:
    uvicorn resets a connection whose app raised, so the exception never reaches it."""

    def broken() -> dict:
        raise RuntimeError("injected bug")

    monkeypatch.setattr(dep.deployment, "status", broken)
    with httpx.Client(base_url=dep.base_url, timeout=30) as http:
        r = http.get(HOT_LOAD, headers=dep.hot_load_headers())
        assert r.status_code == 500 and r.json()["error"]["code"] == "INTERNAL", r.text
        first = r.extensions["network_stream"].get_extra_info("client_addr")
        ok = http.post(COMPLETIONS, json=completion(), headers=auth(dep))
        assert ok.status_code == 200, ok.text
        assert ok.extensions["network_stream"].get_extra_info("client_addr") == first


def test_a_413_closes_the_connection_and_the_next_request_gets_a_new_one(dep):
    with httpx.Client(base_url=dep.base_url, timeout=30, headers=auth(dep)) as http:
        r = http.post(COMPLETIONS, content=b"x" * (LIMIT + 1), headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and r.headers["connection"] == "close"
        assert http.post(COMPLETIONS, json=completion()).status_code == 200


# --------------------------------------------------------------------------- identities


def test_the_hint_is_no_oracle_for_files_outside_the_bucket(dep):
    """Whether the file exists outside the bucket or not, the hint gives the same answer, word for
    word: a path, a traversal or a symlink out of the bucket is never looked up."""
    assert Path("/etc/passwd").exists()
    with httpx.Client(base_url=dep.base_url, timeout=30, headers=dep.hot_load_headers()) as http:
        for identity in ("/etc", "../../../../etc", "escape", "a" * 300, "..", "/"):
            answers = {http.post(HINT, json={"identity": identity, "file": f}).text for f in ("passwd", "no-such-file")}
            assert len(answers) == 1, (identity, answers)
            assert json.loads(answers.pop())["error"]["message"] == HINT_REFUSAL
        # the same identities are refused by the hot-load POST too, before any disk access
        for identity in ("/etc", "../../../../etc", "escape"):
            r = http.post(HOT_LOAD, json={"identity": identity})
            assert r.status_code == 400 and "SNAP-ID-1" in r.json()["error"]["clauses"], r.text


# --------------------------------------------------------------------------- snapshot validation


def fat_header_snapshot(bucket: Path, name: str, entries: int = 900_000) -> Path:
    """A copy of the base whose first shard's header is ~27 MB of JSON (within the validator's 32 MiB
    bound, so it is parsed: ~900k metadata entries), which the safetensors layout then refuses;
    with fewer `entries`, the same refusal from a header the validator reads at once."""
    out = bucket / name
    if out.exists():
        return out
    shutil.copytree(bucket / tiny_moe.BASE_IDENTITY, out)
    shard = sorted(out.glob("*.safetensors"))[0]
    entries = ",".join(f'"k{i:07d}":"{i:020d}"' for i in range(entries))
    header = f'{{"__metadata__":{{{entries}}}}}'.encode()
    shard.write_bytes(len(header).to_bytes(8, "little") + header)
    return out


def test_validating_a_fat_header_holds_up_no_one(dep):
    """The report: validating a signalled snapshot with an 84 MB header held the event loop 19 s.
    Validation runs in a process of its own: the signal is refused (400) and every probe meanwhile
    answers within PROBE_SECONDS, the server's memory untouched by the parse."""
    fat_header_snapshot(dep.settings.bucket, "fat-header")
    with Probe(dep) as probe, Budget("reference", "a snapshot with a 27 MB header", seconds=30, rss_mb=RSS_MB):
        r = httpx.post(
            dep.base_url + HOT_LOAD, json={"identity": "fat-header"}, headers=dep.hot_load_headers(), timeout=60
        )
    assert r.status_code == 400 and "could not be validated" not in r.text, r.text[:300]
    assert len(probe.latencies) >= 3, "the validation was too quick to show anything"


def test_a_validator_past_its_time_is_a_400(dep, monkeypatch):
    fat_header_snapshot(dep.settings.bucket, "fat-header")
    monkeypatch.setattr(dep.deployment, "settings", replace(dep.deployment.settings, validate_timeout=0.05))
    with Probe(dep), Budget("reference", "a validation past its time", seconds=SECONDS, rss_mb=RSS_MB):
        r = httpx.post(dep.base_url + HOT_LOAD, json={"identity": "fat-header"}, headers=dep.hot_load_headers())
    assert r.status_code == 400 and "the validator took longer than 0.05 s" in r.text, r.text[:300]


def test_a_validator_that_dies_is_a_400(dep):
    """The validator's process killed with a snapshot to validate (as the kernel's OOM killer
    would): that signal is refused, and the next one gets a fresh validator. The validator is
    stopped before the signal, so the job is still in its pipe when it dies, however fast a
    validation is on the machine (no race with a validation that finished first). So the snapshot
    need not be slow to validate: a thin header, refused alike, and the fresh validator's verdict
    on it costs milliseconds, not the 27 MB parse (5 s of CPU)."""
    fat_header_snapshot(dep.settings.bucket, "thin-header", entries=1000)
    validator.shared().warm()
    pid = validator.shared().pid()
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    job = os.open(f"/proc/{pid}/fd/0", os.O_RDONLY | os.O_NONBLOCK)  # the validator's stdin: the job's pipe

    def queued() -> int:
        n = array.array("i", [0])
        fcntl.ioctl(job, termios.FIONREAD, n)
        return n[0]

    answer: list[httpx.Response] = []
    poster = threading.Thread(
        target=lambda: answer.append(
            httpx.post(
                dep.base_url + HOT_LOAD, json={"identity": "thin-header"}, headers=dep.hot_load_headers(), timeout=60
            )
        )
    )
    try:
        with Budget("reference", "a validator killed with a job", seconds=30, rss_mb=RSS_MB):
            poster.start()
            wait_until(lambda: queued() > 0, timeout=20, interval=0.01, what="the snapshot sent to the validator")
            os.kill(pid, signal.SIGKILL)
            poster.join()
    finally:
        os.close(job)
    assert answer[0].status_code == 400 and "the validator died" in answer[0].text, answer[0].text[:300]
    r = httpx.post(
        dep.base_url + HOT_LOAD, json={"identity": "thin-header"}, headers=dep.hot_load_headers(), timeout=60
    )
    assert r.status_code == 400 and "could not be validated" not in r.text, r.text[:300]
    assert validator.shared().pid() not in (None, pid)
