"""`rlrollout numerics`: its options, and the verdict printed from what the numerics workflow
(pytest_rlrollout.numerics.workflow) found."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pytest_rlrollout.cli.console import print_text, progress
from pytest_rlrollout.cli.exits import EXIT_FINDINGS, EXIT_OK, UsageError
from pytest_rlrollout.engines import NUMERICS
from pytest_rlrollout.numerics import MAX_KL, MIN_ROUTE_AGREEMENT, Sampling

DEFAULT = Sampling()

DESCRIPTION = (
    "Samples one completion per prompt (token-id prompts, temperature 1) with logprobs and, for an MoE model, "
    "routing matrices; scores the same tokens with a local forward pass of --snapshot; prints the figures (mean "
    "and max |logprob delta|, k3 KL, ratios outside [0.5, 2], routing agreement overall and per MoE layer). Exit "
    "status: 0 every threshold holds, 1 a threshold is crossed (each one named), 2 usage or connection error."
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    nm = sub.add_parser(
        "numerics",
        help="compare a deployment's logprobs and routing with a local forward pass of the weights it serves",
        description=DESCRIPTION,
    )
    nm.add_argument("--deployment", metavar="NAME", help="accounts/<a>/deployments/<d> (a Fireworks deployment)")
    nm.add_argument(
        "--base-url",
        metavar="URL",
        help="the API base (default https://api.fireworks.ai with "
        "--deployment; without it, an OpenAI-compatible server)",
    )
    nm.add_argument("--model", help="the model the deployment serves")
    nm.add_argument(
        "--engine",
        choices=["auto", *NUMERICS],
        default=DEFAULT.engine,
        help="whose wire the deployment speaks (default auto: decided as the suite decides it)",
    )
    nm.add_argument("--api-key", metavar="KEY", help="default: $FIREWORKS_API_KEY")
    nm.add_argument("--inference-url", metavar="URL", help="where /v1/completions is (default: from --base-url)")
    nm.add_argument(
        "--snapshot",
        type=Path,
        required=True,
        metavar="DIR",
        help="a local copy of the weights the deployment serves (config.json and safetensors)",
    )
    nm.add_argument(
        "--prompts",
        type=_count,
        default=DEFAULT.prompts,
        metavar="N",
        help=f"prompts, one completion each (default {DEFAULT.prompts})",
    )
    nm.add_argument(
        "--tokens",
        type=_count,
        default=DEFAULT.tokens,
        metavar="N",
        help=f"tokens generated per prompt (default {DEFAULT.tokens})",
    )
    nm.add_argument(
        "--scorer",
        choices=["auto", "numpy", "transformers"],
        default="auto",
        help="the local forward pass (default auto: the numpy engine for small models on the CPU, else transformers)",
    )
    nm.add_argument("--device", default="cpu", help="where the transformers scorer runs (default cpu; cuda, cuda:1)")
    nm.add_argument(
        "--seed",
        type=int,
        default=DEFAULT.seed,
        help=f"the sampling seed of the first prompt (prompt i: seed + i; default {DEFAULT.seed})",
    )
    nm.add_argument("--no-routing", action="store_true", help="compare logprobs only (no routing matrices asked)")
    nm.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT.timeout,
        help=f"seconds to wait for each read (default {DEFAULT.timeout:g})",
    )
    nm.add_argument("--out", type=Path, metavar="DIR", help="write numerics.json and the pictures (PNG) here")
    nm.add_argument("--max-kl", type=float, default=MAX_KL, metavar="X", help=f"largest k3 KL (default {MAX_KL:g})")
    nm.add_argument("--max-logprob-delta", type=float, metavar="X", help="largest |logprob delta| (default: none)")
    nm.add_argument(
        "--min-route-agreement",
        type=float,
        default=MIN_ROUTE_AGREEMENT,
        metavar="F",
        help=f"least routing agreement over (layer, token), a fraction (default {MIN_ROUTE_AGREEMENT:g})",
    )
    nm.set_defaults(run=run)


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"not a positive whole number: {text!r}")
    return n


def _tell(text: str) -> None:
    print(f"rlrollout numerics: {text}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Sample rollouts from a deployment, score the same tokens with a local forward pass of the
    weights it serves, print the figures (and write them with --out). Exit 0 when every threshold
    holds, 1 naming each one crossed, 2 for a usage or connection error (one line, never the key)."""
    # imported here: `rlrollout --help` stays clear of httpx, numpy and the scorers
    from pytest_rlrollout.numerics import workflow
    from pytest_rlrollout.suite.run_config import DEFAULT_BASE_URL

    if not 0.0 <= args.min_route_agreement <= 1.0:
        raise UsageError(f"--min-route-agreement {args.min_route_agreement:g}: a fraction in [0, 1] (0.9 is 90%)")
    if args.deployment is None and args.base_url is None:
        raise UsageError("pass --deployment accounts/<a>/deployments/<d> and/or --base-url URL")
    thresholds = workflow.Thresholds(
        max_kl=args.max_kl, max_logprob_delta=args.max_logprob_delta, min_route_agreement=args.min_route_agreement
    )
    sampling = Sampling(
        prompts=args.prompts,
        tokens=args.tokens,
        seed=args.seed,
        routing=not args.no_routing,
        engine=args.engine,
        timeout=args.timeout,
    )
    try:
        target = workflow.deployment_target(
            args.deployment,
            args.base_url or DEFAULT_BASE_URL,
            args.model,
            args.api_key or os.environ.get("FIREWORKS_API_KEY") or "",
            args.inference_url or "",
        )
        found = workflow.compare_deployment(
            target,
            args.snapshot,
            sampling=sampling,
            scorer=args.scorer,
            device=args.device,
            tell=_tell,
            progress=progress,
        )
    except workflow.NumericsError as e:
        raise UsageError(str(e)) from None
    crossed = thresholds.crossed(found.figures)
    print_text("\n".join(found.lines()), sys.stdout)
    if args.out is not None:
        path, written = workflow.write(args.out, found, thresholds, crossed, tell=_tell)
        print(f"wrote {path}" + (f" and {len(written)} pictures" if written else ""))
    if found.figures.route_agreement is None and found.routing_asked:
        _tell(f"note: routing not compared: the {found.scorer} scorer reports none")
    for c in crossed:
        print_text(f"threshold crossed: {c}", sys.stdout)
    if not crossed:
        print("every threshold holds")
    return EXIT_FINDINGS if crossed else EXIT_OK
