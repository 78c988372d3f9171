"""Where a deployment is and what it is called: the `Target` every client and driver is given."""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_rlrollout.engines import DEFAULT, Engine, spec
from pytest_rlrollout.remote.secret import Secret


@dataclass(frozen=True)
class Target:
    """Where a deployment is and what it is called. The key is a `Secret`: it never shows.

    A Fireworks hot-load deployment has a name (accounts/<a>/deployments/<d>), which is also the
    `model` of its inference requests; a plain OpenAI-compatible server needs none and is asked
    for `model` by name."""

    deployment: str | None  # accounts/<a>/deployments/<d>
    base_url: str  # the API base (control plane and hot-load API)
    model: str  # the model the deployment serves, for fireworks-model
    api_key: Secret = field(repr=False)
    inference_url: str = ""  # as given; empty: see `inference_base`
    engine: Engine = DEFAULT
    # a control plane of its own (CoreWeave's hot-load API), with a key of its own; empty: the base URL and key
    control_url: str = ""
    control_key: Secret | None = field(default=None, repr=False)
    # the engines of a fleet with no gateway, which the suite fans out to itself (rl_fleet_urls);
    # base_url is then the first of them
    members: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if spec(self.engine).names == "path" and not _is_deployment_name(self.deployment):
            raise ValueError(f"{self.deployment!r} is not accounts/<account>/deployments/<deployment>")
        if not isinstance(self.api_key, Secret):
            object.__setattr__(self, "api_key", Secret(self.api_key))
        if self.control_key is not None and not isinstance(self.control_key, Secret):
            object.__setattr__(self, "control_key", Secret(self.control_key))

    @property
    def inference_base(self) -> str:
        """Where /v1/completions lives: as given, else base URL + /inference (Fireworks) or the
        base URL itself (an OpenAI-compatible server)."""
        base = self.base_url.rstrip("/")
        return (self.inference_url or base + spec(self.engine).inference_prefix).rstrip("/")

    @property
    def control_base(self) -> str:
        """Where the control plane lives: as given, else the base URL."""
        return (self.control_url or self.base_url).rstrip("/")

    @property
    def name(self) -> str:
        """What to call the deployment in reports: its name, else the model at its URL."""
        return self.deployment or f"{self.model} at {self.base_url}"

    @property
    def by_name(self) -> bool:
        """Whether requests name the deployment (Fireworks: its name is the inference `model` and
        a header); a CoreWeave deployment's UUID names it on the hot-load API only."""
        return spec(self.engine).model_is_name and self.deployment is not None

    @property
    def body_model(self) -> str:
        """The `model` of an inference request: the deployment's name on Fireworks (what the
        official SDK sends), the served model's name on an OpenAI-compatible server."""
        return self.deployment if self.by_name and self.deployment else self.model

    @property
    def account(self) -> str:
        return self._parts[1]

    @property
    def deployment_id(self) -> str:
        return self._parts[3]

    @property
    def _parts(self) -> list[str]:
        if self.deployment is None:
            raise ValueError(f"{self.name} has no deployment name (an {self.engine} server)")
        return self.deployment.split("/")


def _is_deployment_name(name: str | None) -> bool:
    parts = (name or "").split("/")
    return len(parts) == 4 and parts[0] == "accounts" and parts[2] == "deployments" and all(parts)
