"""The smg binding: SGLang's model gateway (`smg launch --enable-rl`) in front of a fleet of vLLM
engines, each driven with vLLM's binding and judged on its own.

- The engines: `GET /v1/rl/workers` (id, url, engine, version, health, the gateway's belief of
  the weight version). They are the deployment's replicas, named by URL.
- Control: vLLM's RL routes fanned out by `/v1/rl/engine/{path}?selector=engine=vllm`; the
  gateway answers per engine (`results{id: {status, body}}`, `failed[]`), 200 when every engine
  succeeded, 207 when some failed. Read here as one vLLM answer when every engine gave the same
  one; otherwise as the gateway's answer (its status, 207 or 502 when the engines answered
  differently under a 200), which names each engine and what it said.
- What is served: each engine's own `GET /weight_info`, fanned out (never the gateway's belief in
  the worker list): one replica per engine.
- Inference: the gateway's OpenAI routes. A session (the contract's `x-multi-turn-session-id`,
  else `x-session-affinity`) becomes the routing key `x-smg-routing-key`, and the engine named in
  `x-smg-routed-worker-id` is the serving replica (`fireworks-backend-host`, the contract's name
  for it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Unpack

import httpx

from pytest_rlrollout.engines.smg import ENGINE, MEMBERS, ROUTED_WORKER, ROUTING_KEY
from pytest_rlrollout.remote.discovery import PROBE_IDS, PROBE_TEXT, Answered, Discovery, get, mark, said
from pytest_rlrollout.remote.drivers.base import Driver, Status, registered
from pytest_rlrollout.remote.drivers.vllm import GENERATE, VLLMDriver, generate_body, openai_body
from pytest_rlrollout.remote.openai_wire import bound, token_prompt
from pytest_rlrollout.remote.options import CompletionOptions, LoadOptions
from pytest_rlrollout.remote.sse import SSEDecoder, event_data
from pytest_rlrollout.remote.stream import REPLICA_HEADER, Stream, as_object, json_object

if TYPE_CHECKING:
    from pytest_rlrollout.remote.client import DeploymentClient

WORKERS = "/v1/rl/workers"
FANOUT = "/v1/rl/engine"
SESSION_HEADERS = ("x-multi-turn-session-id", "x-session-affinity")  # the contract's, in precedence order


def session_key(headers: dict[str, str] | None) -> str | None:
    """The session a request belongs to, by the contract's headers in their precedence order."""
    return next(((headers or {})[h] for h in SESSION_HEADERS if (headers or {}).get(h)), None)


def listed_workers(r: httpx.Response) -> list[dict[str, Any]] | None:
    """The engines of a `GET /v1/rl/workers` answer, or None when it is not one."""
    doc = json_object(r) if r.status_code == 200 else None
    workers = doc.get("workers") if doc is not None else None
    return [as_object(w) for w in workers] if isinstance(workers, list) else None


def per_engine(r: httpx.Response) -> dict[str, tuple[int | None, Any]]:
    """A fan-out's answer per engine (by URL, else id): (status, body); {} when it is none."""
    results = as_object((json_object(r) or {}).get("results"))
    out = {}
    for key, each in results.items():
        each = as_object(each)
        status = each.get("status")
        out[str(each.get("url") or key)] = (status if isinstance(status, int) else None, each.get("body"))
    return out


def as_one_answer(r: httpx.Response) -> httpx.Response:
    """A fan-out's answer read as one engine's: the engines' common answer (status and body) when
    they all gave the same one; otherwise the gateway's own answer, its status a failure (207
    stays; a 200 over engines that disagree becomes 502) and its body naming each engine."""
    engines = per_engine(r)
    answers = {(status, repr(body)) for status, body in engines.values()}
    if r.status_code in (200, 207) and len(answers) == 1:
        status, body = next(iter(engines.values()))
        if status is not None:
            return httpx.Response(status, json=body, request=r.request)
    if r.status_code == 200 and engines:  # every engine succeeded, differently: not one answer
        return httpx.Response(502, content=r.content, headers={"content-type": "application/json"}, request=r.request)
    return r


class FannedOut(Driver):
    """A binding's control calls fanned out to a fleet's engines (`_fanout`: through a gateway, or
    by the suite itself) and read as one engine's answer when they all gave the same one; what is
    served read per engine, one replica each. Mixed in before the engine's own driver."""

    status_route = "/weight_info"  # where an engine of the binding says its label (weight_version)
    fanned_by = "The gateway's answer"  # what the fan-out's own answer is, in a failed load's account

    def _fanout(self, method: str, path: str, *, headers: dict[str, str] | None = None, **kw: Any) -> httpx.Response:
        raise NotImplementedError

    def _post(
        self,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        wait: float | None = None,
        **params: Any,
    ) -> httpx.Response:
        query = {k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items()}
        sent = {"Content-Type": "application/json"} | (headers or {})
        # a bodyless POST is sent with {} (an SGLang engine refuses a control POST without a body)
        return as_one_answer(
            self._fanout("POST", path, json={} if body is None else body, headers=sent, params=query, wait=wait)
        )

    def _get(self, path: str, *, headers: dict[str, str] | None = None) -> httpx.Response:
        return as_one_answer(self._fanout("GET", path, headers=headers))

    def load(
        self,
        signal: dict[str, Any],
        **options: Unpack[LoadOptions],
    ) -> httpx.Response:
        """The binding's load, every step fanned out. Where the engines did not all succeed, the answer
        says which did not, what the fleet serves after it (each engine's label, mixed when they
        differ) and then gives the fan-out's own per-engine answer."""
        r = super().load(signal, **options)
        engines = per_engine(r)
        if r.status_code == 200 or not engines:
            return r
        failed = {url: (status, body) for url, (status, body) in sorted(engines.items()) if status != 200}
        served = {x.get("name"): x.get("current_snapshot_identity") for x in self.status().replicas}
        mixed = "mixed snapshots" if len(set(served.values())) > 1 else "one snapshot"
        said = (
            f"the load failed on {', '.join(f'{url} (HTTP {status})' for url, (status, _) in failed.items())}, "
            f"{len(failed)} of {len(engines)} engines, and the fleet now serves {mixed}: "
            + ", ".join(f"{name} {identity!r}" for name, identity in sorted(served.items()))
            + "; "
            + "; ".join(f"{url} answered {str(body)[:200]}" for url, (_, body) in failed.items())
            + f". {self.fanned_by} (HTTP {r.status_code}): {r.text[:2000]}"
        )
        return httpx.Response(r.status_code, text=said, request=r.request)

    def engine_kinds(self) -> list[str]:
        """Each engine's kind and version ("vllm 0.32.0")."""
        raise NotImplementedError

    def counted(self, d: Discovery) -> Discovery:
        """What the probes found, the fleet's engines its replicas and their kinds its version."""
        kinds = self.engine_kinds()
        d.replicas = len(kinds)
        d.version = f"{len(kinds)} engine(s): {', '.join(sorted(set(kinds)))}"
        return d

    def status(self, *, headers: dict[str, str] | None = None) -> Status:
        """Each engine's own label (its binding's status route, fanned out): one replica per engine."""
        route = self.status_route
        r = self._fanout("GET", route, headers=headers)
        engines = per_engine(r)
        if not engines:
            return Status(
                r, [], [f"GET {route} (fanned out): HTTP {r.status_code}, no engine answered: {r.text[:200]!r}"]
            )
        replicas, problems = [], []
        for name, (status, body) in sorted(engines.items()):
            label = as_object(body).get("weight_version") if status == 200 else None
            if not isinstance(label, str):
                problems.append(f"{name}: GET {route} answered {status} {str(body)[:120]}")
            state = {"stage": "ready" if isinstance(label, str) else "error", "target_snapshot_identity": label or ""}
            replicas.append(
                {
                    "name": name,
                    "readiness": isinstance(label, str),
                    "current_snapshot_identity": label if isinstance(label, str) else None,
                    "loading_state": state,
                }
            )
        return Status(r, replicas, problems)


class GatewayDriver(FannedOut, VLLMDriver):
    engine = registered(ENGINE)

    prompts_in_ids = False  # the gateway's OpenAI routes take text prompts only (smg 1.13)

    def __init__(self, client: DeploymentClient, *, bucket: str | None = None):
        super().__init__(client, bucket=bucket)
        self.selector = MEMBERS
        self._route_of: dict[str | None, str | None] = {}  # routing key -> the engine it reaches
        self._listed: list[dict[str, Any]] | None = None  # the engines the gateway lists (read once)

    # ------------------------------------------------------------------ control, fanned out

    def _fanout(self, method: str, path: str, *, headers: dict[str, str] | None = None, **kw: Any) -> httpx.Response:
        params = {"selector": self.selector, **kw.pop("params", {})}
        sent = self.client.auth_headers() | (headers or {})
        url = self.target.base_url.rstrip("/") + FANOUT + path
        return self.client.request(method, url, headers=sent, params=params, **kw)

    def reload_refused(self, answer: httpx.Response, identity: str, headers: dict[str, str] | None) -> None:
        """Some engines reloaded and some did not: each engine that did is labelled with what it
        now serves (through its proxy route, still paused), so that no label names weights the
        engine no longer has; the others keep theirs. The fleet serves mixed snapshots, and says so."""
        for url, (status, _) in per_engine(answer).items():
            if status == 200 and (route := self.engine_route(url, "/update_weight_version")) is not None:
                self.client.request(
                    "POST", route, json={"new_version": identity}, headers=self.client.auth_headers() | (headers or {})
                )

    # ------------------------------------------------------------------ inference, routed

    def complete(
        self,
        body: dict[str, Any],
        **options: Unpack[CompletionOptions],
    ) -> Stream:
        sent = dict(options.get("headers") or {})
        if (session := session_key(sent)) is not None:
            sent[ROUTING_KEY] = session
        options["headers"] = sent
        if token_prompt(body.get("prompt")) and not options.get("chat"):
            return self._on_engine(body, sent, options.get("on_chunk"), options.get("on_status"))
        s = super().complete(body, **options)
        served = s.headers.get(ROUTED_WORKER)
        if served is not None:
            s.headers[REPLICA_HEADER] = served
        return s

    def _on_engine(
        self,
        body: dict[str, Any],
        headers: dict[str, str],
        on_chunk: Callable[[dict[str, Any]], None] | None,
        on_status: Callable[[int], None] | None,
    ) -> Stream:
        """A token-id completion, which the gateway's OpenAI routes refuse (smg 1.13: a prompt is a
        string or strings), sent to the engine the gateway routes its session to, through that
        engine's proxy route: the engine's own answer, its replica named. The proxy answers once
        the engine has: a stream comes back whole (its chunks seen then), so the tests whose
        streams must cross a swap prompt in text (`prompts_in_ids`)."""
        return self._proxied(self._routed(headers.get(ROUTING_KEY)), body, headers, on_chunk, on_status)

    def _proxied(
        self,
        url: str | None,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
        on_chunk: Callable[[dict[str, Any]], None] | None = None,
        on_status: Callable[[int], None] | None = None,
    ) -> Stream:
        """`body` completed by the engine at `url` through its proxy route: its generate route
        where the engines say versions only there (`find_version_route` found it), else its
        OpenAI completions."""
        path = GENERATE if self.generate else "/v1/completions"
        route = self.engine_route(url or "", path)
        if route is None:
            return Stream(0, {}, body=f"no engine listed at {url} (GET {WORKERS})", reading=self.reading)
        sent, _, salt = bound(body, headers)
        if salt is not None:
            sent["cache_salt"] = salt
        native = generate_body(sent) if self.generate else openai_body(sent)
        proxied = self.client.request(
            "POST",
            route,
            json={"model": self.target.body_model, **native},
            headers=self.client.auth_headers(),
        )
        doc = as_object(json_object(proxied)) if proxied.status_code == 200 else {}
        status = given if isinstance(given := doc.get("status"), int) else proxied.status_code
        answer = doc.get("body")
        out = Stream(status, {REPLICA_HEADER: url or ""}, body=proxied.text, reading=self.reading)
        if on_status is not None:
            on_status(status)
        if status != 200:
            return out
        if not body.get("stream"):
            if isinstance(answer, dict):
                out.chunks.append(self.reading.chunk(answer, out.chunks))
            else:
                out.problems.append(
                    f"POST {route}: the engine's 200 answer is not a JSON object: {str(answer)[:200]!r}"
                )
            return out
        if not isinstance(answer, str):
            out.problems.append(f"POST {route}: the engine's stream came back as {type(answer).__name__}, not its text")
            return out
        decoder = SSEDecoder(what=f"POST {route}")
        for event in [*decoder.feed(answer.encode()), *decoder.close()]:
            out.events.append(event)
            data = event_data(event)
            if data.strip() == "[DONE]":
                out.done = True
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                out.problems.append(f"an event of the engine's stream is not JSON: {data[:120]!r}")
                continue
            if isinstance(chunk, dict):
                out.chunks.append(self.reading.chunk(chunk, out.chunks))
                if on_chunk is not None:
                    on_chunk(chunk)
        return out

    def _routed(self, key: str | None) -> str | None:
        """The engine (its URL) the gateway routes `key` to: asked once per key, by a one-token
        text completion through the gateway (its own routing, never guessed here)."""
        if key not in self._route_of:
            s = super().complete(
                {"prompt": PROBE_TEXT, "max_tokens": 1}, headers={ROUTING_KEY: key} if key is not None else {}
            )
            served = s.headers.get(ROUTED_WORKER)
            if key is None:
                return served
            self._route_of[key] = served
        return self._route_of[key]

    def version_probe(self, body: dict[str, Any]) -> Stream:
        """`body` completed by the first engine the gateway lists, through its proxy route."""
        first = next((str(w["url"]) for w in self._workers() if w.get("url")), None)
        return self._proxied(first, body)

    def engine_kinds(self) -> list[str]:
        """Each engine's kind and version ("vllm 0.32.0"), as the gateway lists them."""
        return [f"{w.get('engine')} {w.get('engine_version')}" for w in self._workers()]

    def engine_route(self, url: str, path: str) -> str | None:
        """Where one engine (by URL) answers its own route `path`: the gateway's proxy route to it;
        None when the gateway lists no engine there."""
        worker = next((w.get("id") for w in self._workers() if w.get("url") == url), None)
        return None if worker is None else f"{self.target.base_url.rstrip('/')}{WORKERS}/{worker}/engine{path}"

    def _workers(self) -> list[dict[str, Any]]:
        """The engines the gateway lists (read once)."""
        if self._listed is None:
            r = self.client.request(
                "GET", self.target.base_url.rstrip("/") + WORKERS, headers=self.client.auth_headers()
            )
            self._listed = listed_workers(r) or []
        return self._listed

    # ------------------------------------------------------------------ what is served

    def started_from(self) -> str | None:
        """The directory every engine was started from (each one's `GET /v1/models` root), when
        they agree."""
        roots = set()
        for status, body in per_engine(self._fanout("GET", "/v1/models")).values():
            data = as_object(body).get("data") if status == 200 else None
            roots.add(as_object(data[0]).get("root") if isinstance(data, list) and data else None)
        root = roots.pop() if len(roots) == 1 else None
        return root if isinstance(root, str) else None

    def paused(self) -> bool | None:
        """True when every engine says it is paused, False when none does; None otherwise."""
        said = {
            as_object(body).get("is_paused")
            for status, body in per_engine(self._fanout("GET", "/is_paused")).values()
            if status == 200
        }
        return said.pop() if len(said) == 1 and isinstance(next(iter(said)), bool) else None

    # ------------------------------------------------------------------ discovery

    @classmethod
    def recognises(cls, client: DeploymentClient, seen: Answered) -> str | None:
        r = get(client, client.target.base_url.rstrip("/") + WORKERS, client.auth_headers(), "--rl-base-url")
        workers = listed_workers(r)
        if not workers:
            return None
        kinds = sorted({str(w.get("engine")) for w in workers})
        return f"GET {WORKERS} lists {len(workers)} engine(s) ({', '.join(kinds)}) behind SGLang's model gateway"

    def discover(self, *, transition: str | None, decided: str) -> Discovery:
        d = self.counted(super().discover(transition=transition, decided=decided))
        if d.has("backend_host"):
            mark(d, "backend_host", True, f"{ROUTED_WORKER} names the engine that served")
        if d.has("token_id_prompts") and not self.prompts_in_ids:
            refused = super().complete({"prompt": PROBE_IDS, "max_tokens": 1})
            mark(
                d,
                "token_id_prompts",
                True,
                "non-streamed, on the routed engine's proxy route"
                + ("" if refused.ok else f" (the gateway's /v1/completions: {said(refused)})"),
            )
        return d
