"""The fleet bindings: a list of engines with no gateway (`rl_fleet_urls`), which the suite fans out
to itself, as RL frameworks without a gateway do; each engine is driven with its own binding
(vLLM's: `fleet`; SGLang's: `sglang-fleet`).

- Control: each of the binding's calls is sent to every engine in turn; their answers are read
  as a gateway's fan-out would give them (`smg.per_engine`): one answer when every engine gave
  the same one, else the per-engine answers as the failure they are (207).
- What is served: each engine's own label (vLLM: `GET /weight_info`; SGLang: `GET
  /model_info`), one replica per engine.
- Inference: a session (the contract's `x-multi-turn-session-id`, else `x-session-affinity`) is
  routed to one engine by a hash of its key (a request without one: the first engine), which is
  named as the serving replica; every route of the engine's own is there (token ids, spans).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Unpack

import httpx

from pytest_rlrollout.engines import sglang, sglang_fleet, vllm
from pytest_rlrollout.engines.fleet import ENGINE
from pytest_rlrollout.remote.discovery import Answered, Discovery
from pytest_rlrollout.remote.drivers.base import registered
from pytest_rlrollout.remote.drivers.sglang import SGLangDriver
from pytest_rlrollout.remote.drivers.smg import FannedOut, GatewayDriver, session_key
from pytest_rlrollout.remote.drivers.vllm import vllm_version
from pytest_rlrollout.remote.options import CompletionOptions
from pytest_rlrollout.remote.stream import REPLICA_HEADER, Stream, json_object

if TYPE_CHECKING:
    from pytest_rlrollout.remote.client import DeploymentClient
    from pytest_rlrollout.remote.target import Target


class Listed:
    """A fleet the suite was given by its engines' URLs: it fans every call out itself and routes
    each session to one engine. Mixed in before the fan-out's reading and the engine's binding."""

    prompts_in_ids = True  # every engine is reached on its own routes
    fanned_by = "The engines' answers, as the suite fanned the call out"

    @property
    def members(self) -> tuple[str, ...]:
        target = self.target  # type: ignore[attr-defined]
        return tuple(u.rstrip("/") for u in target.members) or (target.base_url.rstrip("/"),)

    def _fanout(self, method: str, path: str, *, headers: dict[str, str] | None = None, **kw: Any) -> httpx.Response:
        """The call sent to every engine, their answers put together as a gateway's fan-out
        answers (results by engine; 200 when every engine answered 200, else 207)."""
        client = self.client  # type: ignore[attr-defined]
        results, failed = {}, []
        for url in self.members:
            r = client.request(method, url + path, headers=client.auth_headers() | (headers or {}), **kw)
            body = json_object(r)
            results[url] = {"url": url, "status": r.status_code, "body": body if body is not None else r.text[:2000]}
            if r.status_code != 200:
                failed.append({"url": url, "status": r.status_code})
        doc = {"results": results, "failed": failed, "total": len(results), "succeeded": len(results) - len(failed)}
        return httpx.Response(
            207 if failed else 200, json=doc, request=httpx.Request(method, f"{self.members[0]}{path}")
        )

    def complete(
        self,
        body: dict[str, Any],
        **options: Unpack[CompletionOptions],
    ) -> Stream:
        key = session_key(options.get("headers"))
        engine = self.members[0] if key is None else self.members[_bucket(key, len(self.members))]
        s = self.complete_at(engine, body, **options)  # type: ignore[attr-defined]
        s.headers[REPLICA_HEADER] = engine
        return s

    def version_probe(self, body: dict[str, Any]) -> Stream:
        """`body` completed by the first engine, on its own routes."""
        return self.complete_at(self.members[0], body)  # type: ignore[attr-defined]

    def engine_route(self, url: str, path: str) -> str | None:
        """An engine answers its own routes at its own URL."""
        return url + path if url in self.members else None

    def kinds(self, route: str, key: str, engine: str) -> list[str]:
        """Each engine's kind and version, from the field `key` of its `GET route`."""
        client, kinds = self.client, []  # type: ignore[attr-defined]
        for url in self.members:
            r = client.request("GET", url + route, headers=client.auth_headers())
            version = (json_object(r) or {}).get(key) if r.status_code == 200 else None
            kinds.append(f"{engine} {version}" if isinstance(version, str) else f"{url}: no {engine} version")
        return kinds

    @classmethod
    def claims(cls, target: Target) -> bool:
        return bool(target.members)


class FleetDriver(Listed, GatewayDriver):
    """vLLM engines: vLLM's binding on each (what the smg driver does through its gateway)."""

    engine = registered(ENGINE)

    def engine_kinds(self) -> list[str]:
        return self.kinds("/version", "version", vllm.NAME)

    @classmethod
    def recognises(cls, client: DeploymentClient, seen: Answered) -> str | None:
        members = client.target.members
        version = vllm_version(client) if members else None
        if version is None:
            return None
        return (
            f"rl_fleet_urls names {len(members)} engines (no gateway: the suite fans out to them itself); "
            f"GET /version of the first answers vLLM {version}"
        )


class SGLangFleetDriver(Listed, FannedOut, SGLangDriver):
    """SGLang engines: SGLang's binding on each, its loads (retract, update from disk with the
    label, continue) fanned out step by step."""

    engine = registered(sglang_fleet.ENGINE)
    status_route = "/model_info"

    def engine_kinds(self) -> list[str]:
        return self.kinds("/server_info", "version", sglang.NAME)

    @classmethod
    def recognises(cls, client: DeploymentClient, seen: Answered) -> str | None:
        members = client.target.members
        said = SGLangDriver.recognises(client, seen) if members else None
        if said is None:
            return None
        return f"rl_fleet_urls names {len(members)} engines (no gateway: the suite fans out to them itself); {said}"

    def discover(self, *, transition: str | None, decided: str) -> Discovery:
        return self.counted(super().discover(transition=transition, decided=decided))


def _bucket(key: str, n: int) -> int:
    """The engine a session key goes to: a stable hash of the key, the same in every process."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % n
