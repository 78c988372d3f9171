"""The fleet binding: a list of vLLM engines with no gateway (`rl_fleet_urls`), which the suite
fans out to itself, as RL frameworks without a gateway do.

- Control: each of vLLM's RL calls is sent to every engine in turn; their answers are read as
  a gateway's fan-out would give them (`smg.per_engine`): one answer when every engine gave the
  same one, else the per-engine answers as the failure they are (207).
- What is served: each engine's own `GET /weight_info`, one replica per engine.
- Inference: a session (the contract's `x-multi-turn-session-id`, else `x-session-affinity`) is
  routed to one engine by a hash of its key (a request without one: the first engine), which is
  named as the serving replica; every route of the engine's own is there (token ids, spans).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx

from pytest_rlrollout.engines.fleet import ENGINE
from pytest_rlrollout.remote.discovery import Answered
from pytest_rlrollout.remote.drivers.smg import GatewayDriver, session_key
from pytest_rlrollout.remote.drivers.vllm import vllm_version
from pytest_rlrollout.remote.stream import REPLICA_HEADER, Stream, json_object

if TYPE_CHECKING:
    from pytest_rlrollout.remote.client import DeploymentClient, Target


class FleetDriver(GatewayDriver):
    engine = ENGINE.name
    prompts_in_ids = True  # every engine is reached on its own routes

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(u.rstrip("/") for u in self.target.members) or (self.target.base_url.rstrip("/"),)

    def _fanout(self, method: str, path: str, *, headers: dict[str, str] | None = None, **kw: Any) -> httpx.Response:
        """The call sent to every engine, their answers put together as a gateway's fan-out
        answers (results by engine; 200 when every engine answered 200, else 207)."""
        results, failed = {}, []
        for url in self.members:
            r = self.client.request(method, url + path, headers=self.client.auth_headers() | (headers or {}), **kw)
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
        *,
        chat: bool = False,
        headers: dict[str, str] | None = None,
        on_chunk: Callable[[dict[str, Any]], None] | None = None,
        on_status: Callable[[int], None] | None = None,
    ) -> Stream:
        key = session_key(headers)
        engine = self.members[0] if key is None else self.members[_bucket(key, len(self.members))]
        s = self.complete_at(engine, body, chat=chat, headers=headers, on_chunk=on_chunk, on_status=on_status)
        s.headers[REPLICA_HEADER] = engine
        return s

    def engine_route(self, url: str, path: str) -> str | None:
        """An engine answers its own routes at its own URL."""
        return url + path if url in self.members else None

    def engine_kinds(self) -> list[str]:
        kinds = []
        for url in self.members:
            r = self.client.request("GET", url + "/version", headers=self.client.auth_headers())
            version = (json_object(r) or {}).get("version") if r.status_code == 200 else None
            kinds.append(f"vllm {version}" if isinstance(version, str) else f"{url}: no vLLM version")
        return kinds

    @classmethod
    def claims(cls, target: Target) -> bool:
        return bool(target.members)

    @classmethod
    def recognises(cls, client: DeploymentClient, seen: Answered) -> str | None:
        members = client.target.members
        if not members:
            return None
        version = vllm_version(client)
        return (f"rl_fleet_urls names {len(members)} engines (no gateway: the suite fans out to them itself); "
                f"GET /version of the first answers {'vLLM ' + version if version else 'nothing'}")  # fmt: skip


def _bucket(key: str, n: int) -> int:
    """The engine a session key goes to: a stable hash of the key, the same in every process."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % n
