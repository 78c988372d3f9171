"""The CoreWeave dialect's routes: the same engine core behind CoreWeave's v1alpha1 hot-load API
(Dedicated Inference, RL Rollouts preview) and an OpenAI-compatible gateway.

Control plane (`/v1alpha1/inference/...`, `Authorization: Bearer <key>`):
- `POST /hotLoads` `{deploymentId, identity, type, hotLoadId?, promptCachePolicy?,
  incrementalSnapshotMetadata?}` answers 200 `{"hotLoad": {spec, status}}` once the hot-load is
  accepted (state PENDING or IN_PROGRESS); the load goes on after the answer. Enums are taken by
  name or by number (`SNAPSHOT_TYPE_FULL` = 1, `SNAPSHOT_TYPE_INCREMENTAL` = 2;
  `PROMPT_CACHE_POLICY_RESET_ALL` = 1, `PROMPT_CACHE_POLICY_PRESERVE` = 2, the default) and
  answered by name. An incremental snapshot is the project's ARC2 diff (XOR, zstd, Adler-32: the
  encoding CoreWeave's `COMPRESSION_FORMAT_ZSTD` / `CHECKSUM_FORMAT_ADLER32` name).
- `GET /hotLoads/{id}` (state COMPLETED once every replica serves the identity, FAILED when a
  replica's load failed), `GET /hotLoads?parentDeploymentId=` (newest first),
  `GET /hotLoads/{id}/replicas` (`name`, `zone`, `state` PENDING_UPDATE | UPDATING | READY | ERROR,
  `currentSnapshotIdentity`, `errorReason`), `POST /hotLoads/{id}:cancel` (501, as documented).
- Errors are Connect's: `{"code": "invalid_argument", "message": ..., "details": []}` with its
  HTTP mapping (invalid_argument and failed_precondition 400, unauthenticated 401, not_found 404,
  already_exists 409, unimplemented 501). A hot-load while another is unfinished is
  failed_precondition "... already in progress"; a hotLoadId used before is already_exists.

Gateway: `/v1/completions`, `/v1/chat/completions`, `/v1/models`, `/health`, answered as the vLLM
dialect answers them (the engine behind CoreWeave's gateway is vLLM, under NVIDIA Dynamo; the
gateway's own shapes were not measured). No policy version is said on completions (none is
documented).

What the reference decided where CoreWeave's documents are silent: one API key for the control
plane and the gateway unless the hot-load API is given one of its own (`control_api_key`); replicas are named `replica-N` in one zone; a snapshot is validated when
the hot-load is created (every SNAP MUST clause) and refused then with invalid_argument, naming
the rule; a load that fails later fails the hot-load (FAILED, the replica's `errorReason`); an
identity hot-loaded before is refused (already_exists), as the engine core refuses it on every
wire, although CoreWeave documents that several hot-loads may target one identity.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pytest_rlrollout.reference.admission import LoadInProgress
from pytest_rlrollout.reference.controller import Deployment, HotLoadError
from pytest_rlrollout.reference.inference_request import BadRequest, decode_json
from pytest_rlrollout.reference.vllm_app import VllmRoutes, guard_error
from pytest_rlrollout.reference.wire import Guarded, Json, off_loop, on_http_errors, read_body

PREFIX = "/v1alpha1/inference"
SNAPSHOT_TYPES = {"SNAPSHOT_TYPE_FULL": 1, "SNAPSHOT_TYPE_INCREMENTAL": 2}
CACHE_POLICIES = {"PROMPT_CACHE_POLICY_RESET_ALL": 1, "PROMPT_CACHE_POLICY_PRESERVE": 2}
# Connect's codes, by the HTTP status the engine core refuses with
CODES = {
    400: "invalid_argument",
    401: "unauthenticated",
    404: "not_found",
    409: "already_exists",
    412: "failed_precondition",
    501: "unimplemented",
}
HTTP = {
    "invalid_argument": 400,
    "failed_precondition": 400,
    "unauthenticated": 401,
    "not_found": 404,
    "already_exists": 409,
    "unimplemented": 501,
    "internal": 500,
}
FIELDS = {"deploymentId", "identity", "type", "hotLoadId", "promptCachePolicy", "incrementalSnapshotMetadata"}


def connect_error(code: str, message: str) -> JSONResponse:
    return Json({"code": code, "message": message, "details": []}, HTTP[code])


def _enum(value: Any, names: dict[str, int], field: str) -> str:
    """An enum given by name or by number, as its name; invalid_argument otherwise (0 included)."""
    by_number = {v: k for k, v in names.items()}
    if isinstance(value, str) and value in names:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value in by_number:
        return by_number[value]
    raise HotLoadError(400, f"{field}: {value!r} is not one of {', '.join(names)} (or their numbers)")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class CoreWeaveRoutes:
    """The control plane's handlers and the gateway's (the vLLM dialect's inference), over one deployment."""

    def __init__(self, dep: Deployment):
        self.dep, self.s = dep, dep.settings
        self.gateway = VllmRoutes(dep)
        self.hot_loads: dict[str, dict[str, Any]] = {}  # id -> spec, newest last
        self.created: dict[str, str] = {}

    # ----------------------------------------------------------------------- who may call

    def authorized(self, request: Request) -> bool:
        key = self.s.control_api_key or self.s.api_key
        return key is None or request.headers.get("authorization") == f"Bearer {key}"

    def control(self, handler: Any) -> Any:
        async def checked(request: Request) -> Response:
            if not self.authorized(request) and not self.s.fault("HL-AUTH-1"):
                return connect_error("unauthenticated", "a valid bearer token is required")
            return await handler(request)

        return checked

    # ----------------------------------------------------------------------- hot loads

    async def create(self, request: Request) -> Response:
        try:
            body = decode_json(await read_body(request, self.s))
        except BadRequest as e:
            return connect_error("invalid_argument", str(e))
        try:
            spec, signal = self._signal(body)
            await off_loop(lambda: self.dep.hot_load(signal), self.dep.signals)
        except LoadInProgress as e:
            return connect_error("failed_precondition", f"a hot-load is already in progress: {e}")
        except HotLoadError as e:
            return connect_error(CODES.get(e.status, "internal" if e.status >= 500 else "invalid_argument"), str(e))
        self.hot_loads[spec["id"]] = spec
        self.created[spec["id"]] = _now()
        if self.s.fault("HL-POST-1"):  # the fault: an accepted hot-load answered with no body
            return Response(b"", 200)
        return Json({"hotLoad": self._resource(spec["id"])})

    def _signal(self, body: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """The request checked, as the hot-load's spec and the engine core's signal."""
        if not isinstance(body, dict):
            raise HotLoadError(400, "the request body must be a JSON object")
        unknown = sorted(set(body) - FIELDS)
        if unknown and not self.s.fault("HL-POST-2"):
            raise HotLoadError(400, f"unknown field(s) {unknown}")
        if body.get("deploymentId") != self.s.deployment_id:
            raise HotLoadError(404, f"deployment {body.get('deploymentId')!r} not found")
        kind = _enum(body.get("type"), SNAPSHOT_TYPES, "type")
        policy = _enum(body.get("promptCachePolicy", 2), CACHE_POLICIES, "promptCachePolicy")
        hot_load_id = body.get("hotLoadId") or str(uuid.uuid4())
        try:
            hot_load_id = str(uuid.UUID(str(hot_load_id)))
        except ValueError:
            raise HotLoadError(400, f"hotLoadId {hot_load_id!r} is not a UUID") from None
        if hot_load_id in self.hot_loads:
            raise HotLoadError(409, f"hot-load {hot_load_id} already exists")
        meta = body.get("incrementalSnapshotMetadata")
        signal: dict[str, Any] = {
            "identity": body.get("identity"),
            "reset_prompt_cache": "all" if policy.endswith("RESET_ALL") else "none",
        }
        if kind == "SNAPSHOT_TYPE_INCREMENTAL":
            if not isinstance(meta, dict) or not isinstance(meta.get("previousSnapshotIdentity"), str):
                raise HotLoadError(
                    400, "an incremental hot-load needs incrementalSnapshotMetadata.previousSnapshotIdentity"
                )
            signal["incremental_snapshot_metadata"] = {
                "previous_snapshot_identity": meta["previousSnapshotIdentity"],
                "compression_format": "arc_v2",
                "checksum_format": "adler32",
            }
        elif meta is not None:
            raise HotLoadError(400, "incrementalSnapshotMetadata is for SNAPSHOT_TYPE_INCREMENTAL only")
        spec = {
            "id": hot_load_id,
            "deploymentId": self.s.deployment_id,
            "identity": body.get("identity"),
            "type": kind,
            "promptCachePolicy": policy,
            **({"incrementalSnapshotMetadata": meta} if meta is not None else {}),
        }
        return spec, signal

    def _state(self, spec: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        """The hot-load's state and its replicas, from what the engine core says now."""
        identity = spec["identity"]
        entry = next((e for e in self.dep.ledger if e["identity"] == identity), None)
        status = self.dep.status()
        replicas = []
        for i, r in enumerate(status.get("replicas") or status.get("status") or []):
            stage = (r.get("loading_state") or {}).get("stage")
            target = (r.get("loading_state") or {}).get("target_snapshot_identity")
            if r["current_snapshot_identity"] == identity and r["readiness"]:
                state = "READY"
            elif target == identity and stage == "error":
                state = "ERROR"
            elif target == identity:
                state = "UPDATING"
            else:
                state = "PENDING_UPDATE"
            replicas.append(
                {
                    "name": f"replica-{i}",
                    "zone": "local",
                    "state": state,
                    "currentSnapshotIdentity": r["current_snapshot_identity"],
                    "errorReason": (r.get("loading_state") or {}).get("error") or "",
                }
            )
        if entry is not None and entry.get("error"):
            return "HOT_LOAD_STATE_FAILED", replicas
        if replicas and all(x["state"] == "READY" for x in replicas):
            return "HOT_LOAD_STATE_COMPLETED", replicas
        return "HOT_LOAD_STATE_IN_PROGRESS", replicas

    def _resource(self, hot_load_id: str) -> dict[str, Any]:
        spec = self.hot_loads[hot_load_id]
        state, _ = self._state(spec)
        done = state in ("HOT_LOAD_STATE_COMPLETED", "HOT_LOAD_STATE_FAILED")
        return {
            "spec": spec,
            "status": {
                "state": state,
                "createdAt": self.created[hot_load_id],
                "updatedAt": _now(),
                **({"finishedAt": _now()} if done else {}),
            },
        }

    async def get(self, request: Request) -> Response:
        hot_load_id = request.path_params["id"]
        if hot_load_id not in self.hot_loads:
            return connect_error("not_found", f"hot-load {hot_load_id} not found")
        return Json({"hotLoad": self._resource(hot_load_id)})

    async def listed(self, request: Request) -> Response:
        parent = request.query_params.get("parentDeploymentId")
        ids = [i for i, spec in reversed(self.hot_loads.items()) if parent in (None, spec["deploymentId"])]
        return Json({"hotLoads": [self._resource(i) for i in ids], "nextPageToken": ""})

    async def replicas(self, request: Request) -> Response:
        hot_load_id = request.path_params["id"]
        if hot_load_id not in self.hot_loads:
            return connect_error("not_found", f"hot-load {hot_load_id} not found")
        _, replicas = self._state(self.hot_loads[hot_load_id])
        key = "items" if self.s.fault("HL-GET-1") else "replicas"  # the fault: the list under another name
        return Json({key: replicas, "nextPageToken": ""})

    async def cancel(self, request: Request) -> Response:
        return connect_error("unimplemented", "CancelHotLoad is not implemented")

    # ----------------------------------------------------------------------- the app

    def routes(self) -> list[Route]:
        c, g = self.control, self.gateway
        return [
            Route("/health", g.health, methods=["GET"]),
            Route("/v1/models", g.guarded(g.models), methods=["GET"]),
            Route("/v1/completions", g.guarded(g.inference("completions")), methods=["POST"]),
            Route("/v1/chat/completions", g.guarded(g.inference("chat")), methods=["POST"]),
            Route(f"{PREFIX}/hotLoads", c(self.create), methods=["POST"]),
            Route(f"{PREFIX}/hotLoads", c(self.listed), methods=["GET"]),
            Route(f"{PREFIX}/hotLoads/{{id}}:cancel", c(self.cancel), methods=["POST"]),
            Route(f"{PREFIX}/hotLoads/{{id}}/replicas", c(self.replicas), methods=["GET"]),
            Route(f"{PREFIX}/hotLoads/{{id}}", c(self.get), methods=["GET"]),
        ]


async def _http_exception(request: Request, exc: HTTPException) -> Response:
    return connect_error("not_found" if exc.status_code == 404 else "invalid_argument", str(exc.detail))


def create_coreweave_app(dep: Deployment) -> Guarded:
    s = dep.settings
    app = Starlette(routes=CoreWeaveRoutes(dep).routes(), exception_handlers=on_http_errors(_http_exception))
    return Guarded(app, dep.requests, s.max_body_bytes, s.max_header_bytes, guard_error)
