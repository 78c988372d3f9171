"""What answers, and what it offers: the preflight before any test, and the capability probes.

Nothing here changes a deployment: status, ledger and resource reads, and one-token completions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import httpx

from pytest_rlrollout.contract.capabilities import CAPABILITIES
from pytest_rlrollout.engines import SPECS, Engine, spec
from pytest_rlrollout.remote.client import DeploymentClient, Target
from pytest_rlrollout.remote.limits import LimitExceeded
from pytest_rlrollout.remote.stream import EXCERPT, Stream, json_object

if TYPE_CHECKING:
    from pytest_rlrollout.remote.drivers.base import Driver

PROBE_TEXT = "Hello"
PROBE_IDS = [1, 2, 3]


class PreflightError(Exception):
    """The run cannot judge this deployment; the message says what to fix."""


@dataclass
class Discovery:
    """The deployment's engine and capabilities, each with how the probe saw it."""

    engine: Engine
    decided: str  # how the engine was chosen
    capabilities: dict[str, bool] = field(default_factory=dict)
    seen: dict[str, str] = field(default_factory=dict)  # capability -> what the probe observed
    replicas: int = 0
    transition: str | None = None
    # the base's fingerprint as the deployment served it before the run loaded anything (its own
    # start-up load: no later load path can show it again): {"identity", "logprobs"}, or None
    start: dict[str, Any] | None = None
    version: str | None = None  # the engine's version, where it says (vLLM: GET /version)
    # routes of the engine's own found answering, which a driver sends to when they do (vLLM's
    # /inference/v1/generate): an xdist or Locust worker's driver adopts them without probing
    routes: list[str] = field(default_factory=list)

    def has(self, name: str) -> bool:
        if name not in CAPABILITIES:
            raise KeyError(f"unknown capability {name!r} (known: {', '.join(CAPABILITIES)})")
        return self.capabilities.get(name, False)

    def table(self) -> list[tuple[str, str, str]]:
        """(capability, yes/no, what was seen) rows, in vocabulary order."""
        rows = []
        for name, cap in CAPABILITIES.items():
            if name in self.capabilities:
                rows.append((name, "yes" if self.capabilities[name] else "no", self.seen.get(name, cap.probe)))
        return rows

    def as_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "decided": self.decided,
            "capabilities": self.capabilities,
            "seen": self.seen,
            "replicas": self.replicas,
            "transition": self.transition,
            "start": self.start,
            "version": self.version,
            "routes": self.routes,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Discovery:
        return cls(**doc)


# --------------------------------------------------------------------------- preflight


@dataclass
class Answered:
    """What the preflight's first reads found, for the drivers to recognise their engine by (and
    to check the names given against): the hot-load status, whether it or the control plane
    answered, and what an engine's own probe read (each read once)."""

    status: httpx.Response
    hot_load_api: bool
    control_plane: bool
    reads: dict[str, Any] = field(default_factory=dict)

    def read(self, key: str, ask: Callable[[], Any]) -> Any:
        if key not in self.reads:
            self.reads[key] = ask()
        return self.reads[key]


def preflight(client: DeploymentClient, requested: Engine | None) -> tuple[Engine, str]:
    """Reach the deployment the options name, with their key and names: the engine it has
    (`requested`, or decided from what answers) and why. Raises PreflightError saying what to fix."""
    t = client.target
    status = get(client, client._hot_load_url(), client.hot_load_headers(), "--rl-base-url")
    _authorized(status, "GET the hot-load status")
    accounts = get(client, t.base_url.rstrip("/") + "/v1/accounts", client.auth_headers(), "--rl-base-url")
    _authorized(accounts, "GET /v1/accounts")
    seen = Answered(
        status,
        hot_load_api=status.status_code == 200 and json_object(status) is not None,
        control_plane=accounts.status_code == 200 and isinstance((json_object(accounts) or {}).get("accounts"), list),
    )
    if requested is not None:
        engine, decided = requested, f"--rl-engine={requested}"
    else:
        engine, decided = _recognised(client, seen)
    spec(engine).driver_class().check_names(client, seen, decided)
    client.target = _with_engine(t, engine)
    _inference_answers(client)
    return engine, decided


def _recognised(client: DeploymentClient, seen: Answered) -> tuple[Engine, str]:
    """--rl-engine auto: each engine's driver in registry order says whether it recognises what
    answers (those the names given point to, a control plane or a fleet's engines, first); the
    last registered, a plain OpenAI-compatible server, recognises anything."""
    for s in sorted(SPECS, key=lambda s: not s.driver_class().claims(client.target)):
        if (why := s.driver_class().recognises(client, seen)) is not None:
            return s.name, f"auto: {why}"  # type: ignore[return-value]
    raise PreflightError("no engine recognised the deployment")  # the fallback recognises anything


def get(client: DeploymentClient, url: str, headers: dict[str, str], option: str) -> httpx.Response:
    try:
        return client.request("GET", url, headers=headers)
    except (httpx.HTTPError, LimitExceeded) as e:
        raise PreflightError(f"nothing answers at {url} ({type(e).__name__}: {e}): check {option}") from None


def _authorized(r: httpx.Response, what: str) -> None:
    if r.status_code in (401, 403):
        raise PreflightError(
            f"the API key was refused ({what}: HTTP {r.status_code} {excerpt(r)}): check --rl-api-key or FIREWORKS_API_KEY"
        )


def _inference_answers(client: DeploymentClient) -> None:
    t = client.target
    url = client.inference_url()
    try:
        s = client.complete({"prompt": PROBE_TEXT, "max_tokens": 1})
        if s.status in (400, 422) and "model" not in s.body.lower():  # perhaps a server of token-id prompts
            s = client.complete({"prompt": PROBE_IDS, "max_tokens": 1})
    except (httpx.HTTPError, LimitExceeded) as e:
        raise PreflightError(f"nothing answers at {url} ({type(e).__name__}: {e}): check rl_inference_url") from None
    if s.status in (401, 403):
        raise PreflightError(f"the API key was refused (POST {url}: HTTP {s.status}): check --rl-api-key")
    if s.status == 200 and s.chunks:
        return
    said = s.body[:EXCERPT]
    if s.status in (400, 404) and "model" in said.lower():
        names = "--rl-deployment" if spec(t.engine).model_is_name else "--rl-model"
        raise PreflightError(
            f"the deployment does not serve model {t.body_model!r} (HTTP {s.status} {said}): check {names}"
        )
    if s.status in (404, 405):
        raise PreflightError(f"no completions endpoint at {url} (HTTP {s.status} {said}): check rl_inference_url")
    raise PreflightError(f"a one-token completion at {url} was not answered (HTTP {s.status} {said})")


def _with_engine(t: Target, engine: Engine) -> Target:
    return t if t.engine == engine else replace(t, engine=engine)


def excerpt(r: httpx.Response) -> str:
    return r.text[:200]


# --------------------------------------------------------------------------- capabilities


def inference_probes(driver: Driver, d: Discovery) -> Stream:
    """What every engine is asked first: a one-token completion of a text prompt, and what its
    answer shows (cached-token channels, the serving replica's header). Returns that answer."""
    text = driver.complete({"prompt": PROBE_TEXT, "max_tokens": 1})
    mark(d, "text_prompts", text.ok and bool(text.chunks), said(text))
    channels = _cached_channels(text)
    mark(d, "cached_tokens", bool(channels), ", ".join(channels) or "no cached-token channel in the answer")
    host = text.replica
    mark(d, "backend_host", host is not None, f"fireworks-backend-host: {host}" if host else "no such header")
    return text


def auth_probe(driver: Driver, d: Discovery) -> None:
    """Whether the deployment checks API keys: a one-token completion under a key it cannot know."""
    wrong = driver.complete({"prompt": PROBE_TEXT, "max_tokens": 1}, headers={"Authorization": "Bearer rl-not-the-key"})
    mark(d, "auth", wrong.status in (401, 403), f"a wrong key: HTTP {wrong.status}")


def mark(d: Discovery, name: str, value: bool, seen: str) -> None:
    """Record what the probe of capability `name` saw."""
    d.capabilities[name] = bool(value)
    d.seen[name] = seen


def said(s: Stream) -> str:
    """A probe's answer in a few words, for the capability table."""
    return "HTTP 200" if s.ok else f"HTTP {s.status} {(s.body or '; '.join(s.problems))[:120]}"


def _cached_channels(s: Stream) -> list[str]:
    return [channel for channel, value in s.cached_tokens().items() if value is not None]
