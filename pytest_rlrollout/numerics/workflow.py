"""A deployment's numerics against the weights it serves, end to end (what `rlrollout numerics`
runs): name the deployment, sample rollouts from it, score the same tokens locally, judge the
figures by thresholds and write them out.

Errors a user can fix (an option, a snapshot, a deployment that cannot be reached) are a
`NumericsError` of one printable line that never holds the key; they name the `rlrollout numerics`
options, the one front end. What the workflow tells along the way goes to the caller's `tell` (a
note per call) and `progress` (a counter per phase), so it prints nothing itself."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from pytest_rlrollout.contract.capabilities import CAPABILITIES
from pytest_rlrollout.contract.moe import MoeShape, moe_shape
from pytest_rlrollout.engines import presumed, spec
from pytest_rlrollout.numerics import MAX_KL, MIN_ROUTE_AGREEMENT, Sampling
from pytest_rlrollout.numerics.figures import Figures
from pytest_rlrollout.numerics.pictures import pictures, unavailable
from pytest_rlrollout.numerics.rollouts import Rollout, RolloutError, compare, sample
from pytest_rlrollout.numerics.scorer import local_scorer
from pytest_rlrollout.remote.client import DeploymentClient
from pytest_rlrollout.remote.discovery import PreflightError
from pytest_rlrollout.remote.drivers import driver_for
from pytest_rlrollout.remote.fingerprint import canary
from pytest_rlrollout.remote.limits import LIVE_LIMITS, LimitExceeded
from pytest_rlrollout.remote.preflight import preflight
from pytest_rlrollout.remote.secret import Secret
from pytest_rlrollout.remote.target import Target
from pytest_rlrollout.snapshot import untrusted

PROMPT_TOKENS = 16  # token ids per prompt: a context to condition on, short beside the completions

Tell = Callable[[str], None]
Progress = Callable[[str], Callable[[int, int], None]]  # a phase's name -> its counter (i of n)


class NumericsError(Exception):
    """A mistake the user can fix, or a deployment that cannot be asked: one line, never the key."""


@dataclass(frozen=True)
class Thresholds:
    max_kl: float = MAX_KL  # largest k3 KL
    max_logprob_delta: float | None = None  # largest |logprob delta|; None: not judged
    min_route_agreement: float = MIN_ROUTE_AGREEMENT  # least agreement over (layer, token), a fraction

    def crossed(self, figures: Figures) -> list[str]:
        """Each threshold the figures cross, as `figure value > --option limit` (a NaN crosses)."""
        out = []
        if not figures.k3_kl <= self.max_kl:
            out.append(f"k3 KL {figures.k3_kl:.3g} > --max-kl {self.max_kl:g}")
        if self.max_logprob_delta is not None and not figures.max_abs <= self.max_logprob_delta:
            out.append(f"max |Δlogprob| {figures.max_abs:.3g} > --max-logprob-delta {self.max_logprob_delta:g}")
        if figures.route_agreement is not None and not figures.route_agreement >= self.min_route_agreement:
            out.append(
                f"routing agreement {figures.route_agreement:.3%} < --min-route-agreement {self.min_route_agreement:g}"
            )
        return out

    def as_dict(self) -> dict[str, float | None]:
        return {
            "max_kl": self.max_kl,
            "max_logprob_delta": self.max_logprob_delta,
            "min_route_agreement": self.min_route_agreement,
        }


@dataclass(frozen=True)
class Comparison:
    """What one run found: the deployment's rollouts scored by the local weights."""

    target: Target
    snapshot: Path
    scorer: str
    device: str
    sampling: Sampling
    policies: list[str]  # the policy versions the rollouts named
    figures: Figures
    alignment: str | None  # how served routing lined up with the local one, when compared
    routing_asked: bool  # routing was asked of the deployment (an MoE model whose engine returns it)

    def lines(self) -> list[str]:
        s = self.sampling
        out = [
            f"deployment               {self.target.name}",
            f"local weights            {self.snapshot} ({self.scorer} scorer on {self.device})",
            f"rollouts                 {s.prompts} prompts x {s.tokens} tokens, seed {s.seed}"
            + (f", policy {', '.join(self.policies)}" if self.policies else ""),
            *self.figures.lines(),
        ]
        if self.alignment is not None:
            out.append(f"routing alignment        {self.alignment}")
        return out


def deployment_target(
    deployment: str | None, base_url: str, model: str | None, api_key: str, inference_url: str = ""
) -> Target:
    """The deployment as the suite's preflight names it: a Fireworks deployment when `deployment`
    is given, else the OpenAI-compatible server at `base_url`."""
    if not model:
        raise NumericsError("pass --model (the model the deployment serves)")
    if deployment is not None and not api_key:
        raise NumericsError(f"--deployment {deployment}: pass --api-key or set FIREWORKS_API_KEY")
    try:
        return Target(
            deployment,
            base_url.rstrip("/"),
            model,
            Secret(api_key),
            inference_url=inference_url,
            engine=presumed(deployment=deployment),
        )
    except ValueError as e:
        raise NumericsError(f"--deployment: {e}") from None


def snapshot_config(snapshot: Path) -> dict[str, Any]:
    """The snapshot's config.json: the vocabulary the prompts are drawn from, and the MoE shape."""
    if not snapshot.is_dir():
        raise NumericsError(f"--snapshot {snapshot}: not a directory")
    try:
        config = json.loads((snapshot / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise NumericsError(f"--snapshot {snapshot}: no readable config.json ({one_line(e)})") from None
    if not isinstance(config, dict):
        raise NumericsError(f"--snapshot {snapshot}: config.json is not a JSON object")
    return config


def compare_deployment(
    target: Target,
    snapshot: Path,
    *,
    sampling: Sampling,
    scorer: str = "auto",
    device: str = "cpu",
    tell: Tell,
    progress: Progress,
) -> Comparison:
    """Sample rollouts from `target` and score the same tokens with a local forward pass of
    `snapshot` (`scorer`: auto, numpy or transformers, on `device`)."""
    config = snapshot_config(snapshot)
    try:  # before sampling: a scorer that cannot load is known without asking the deployment anything
        local = local_scorer(snapshot, scorer, device)
    except (RuntimeError, ValueError, OSError) as e:
        raise NumericsError(f"--scorer {scorer}: {one_line(e)}") from None
    shape = moe_shape(config) if sampling.routing else None  # routing is asked of MoE models only
    prompts = canary(config.get("vocab_size"), sampling.prompts, PROMPT_TOKENS)
    rollouts, shape = _sample(target, sampling, shape, prompts, tell, progress)
    policies = sorted({v for r in rollouts for v in r.versions})
    if len(policies) > 1:
        tell(
            f"note: the rollouts name {len(policies)} policy versions ({', '.join(policies)}): the deployment "
            "swapped while sampling, and --snapshot holds one of them at most"
        )
    try:
        figures, alignment = compare(rollouts, local, progress=progress("scoring"))
    except (ValueError, IndexError) as e:  # token ids or routing the local weights do not have
        raise NumericsError(f"--snapshot {snapshot}: the rollouts do not score with it ({one_line(e)})") from None
    return Comparison(
        target, snapshot, local.name, device, sampling, policies, figures, alignment, routing_asked=shape is not None
    )


def _sample(
    target: Target, sampling: Sampling, shape: MoeShape | None, prompts: list[list[int]], tell: Tell, progress: Progress
) -> tuple[list[Rollout], MoeShape | None]:
    """One sampled completion per prompt, with logprobs, and routing matrices when `shape` is given
    and the engine returns them behind a server flag it has on; the shape routing was asked with."""
    with DeploymentClient(target, timeout=sampling.timeout, limits=LIVE_LIMITS) as client:
        try:  # the engine, as the suite's preflight decides it: its driver samples on its wire
            engine, decided = preflight(client, None if sampling.engine == "auto" else sampling.engine)
            tell(f"engine {engine} ({decided})")
            driver = driver_for(engine, client)
            if spec(engine).discovers_to_sample:  # its sampling reads what discovery found (vLLM: spans)
                found = driver.discover(transition=None, decided=decided)
                driver.adopt(found)
                if shape is not None and not found.has("routing_matrix"):  # a server flag, off
                    flag = CAPABILITIES["routing_matrix"].flag(engine)
                    tell(
                        f"note: routing not compared: {found.seen['routing_matrix']} ({spec(engine).title} returns it with {flag})"
                    )
                    shape = None
            rollouts = sample(
                driver,
                prompts,
                sampling.tokens,
                shape=(shape.layers, shape.k) if shape else None,
                seed=sampling.seed,
                progress=progress("sampling"),
            )
            return rollouts, shape
        except PreflightError as e:
            raise NumericsError(f"{target.name}: {one_line(e)}") from None
        except (httpx.HTTPError, LimitExceeded, RolloutError) as e:
            # the client's messages never hold the key (an echo of it is redacted)
            hint = " (--no-routing compares logprobs only)" if shape and "routing_matrix" in str(e) else ""
            raise NumericsError(f"{target.name}: {one_line(e)}{hint}") from None


def write(
    out: Path, comparison: Comparison, thresholds: Thresholds, crossed: list[str], tell: Tell
) -> tuple[Path, list[str]]:
    """numerics.json and the pictures (numerics-<name>.png) into `out`: the JSON's path and the
    pictures' file names."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, png in pictures(comparison.figures).items():
        (out / f"numerics-{name}.png").write_bytes(png)
        written.append(f"numerics-{name}.png")
    why = unavailable()
    if why is not None:
        tell(f"note: no pictures: {why}")
    c, s = comparison, comparison.sampling
    doc = {
        "deployment": c.target.name,
        "snapshot": str(c.snapshot),
        "scorer": c.scorer,
        "device": c.device,
        "prompts": s.prompts,
        "tokens": s.tokens,
        "seed": s.seed,
        "policies": c.policies,
        "thresholds": thresholds.as_dict(),
        "crossed": crossed,
        "figures": {**c.figures.as_dict(), "alignment": c.alignment},
        "pictures": written,
    }
    path = out / "numerics.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path, written


def one_line(e: BaseException, limit: int = 500) -> str:
    """An error's message as one printable line: it may quote the deployment's answer."""
    try:
        text = str(e)
    except Exception:  # an exception whose own message fails to build
        text = "(no message)"
    return untrusted.brief_text(" ".join(untrusted.printable(text).split()), limit)
