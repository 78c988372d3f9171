"""The preflight before any test: reach the deployment the options name, with their key and
names, and decide its engine (`--rl-engine auto`: each driver recognises its own)."""

from __future__ import annotations

from dataclasses import replace

import httpx

from pytest_rlrollout.engines import SPECS, Engine, spec
from pytest_rlrollout.remote.client import DeploymentClient
from pytest_rlrollout.remote.discovery import PROBE_IDS, PROBE_TEXT, Answered, PreflightError, excerpt, get
from pytest_rlrollout.remote.drivers.fireworks import HotLoadAPI
from pytest_rlrollout.remote.limits import LimitExceeded
from pytest_rlrollout.remote.stream import EXCERPT, json_object
from pytest_rlrollout.remote.target import Target


def preflight(client: DeploymentClient, requested: Engine | None) -> tuple[Engine, str]:
    """Reach the deployment the options name, with their key and names: the engine it has
    (`requested`, or decided from what answers) and why. Raises PreflightError saying what to fix."""
    t = client.target
    api = HotLoadAPI(client)  # every engine is asked first whether a Fireworks API answers
    status = get(client, api.url(), api.headers(), "--rl-base-url")
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
