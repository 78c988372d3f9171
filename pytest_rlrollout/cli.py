"""The `rlrollout` command: validate, export, delta, apply, make-base, serve, conformance, clauses, numerics."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_rlrollout.contract.moe import MoeShape
    from pytest_rlrollout.numerics.figures import Figures
    from pytest_rlrollout.numerics.rollouts import Rollout
    from pytest_rlrollout.remote.client import Target
    from pytest_rlrollout.snapshot.validate import Report

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2
# `validate` only: the validator itself failed. Never 1: a crash is not a verdict on the snapshot
# (a CI gate must not read a bug as "the exporter is broken"), and never a traceback.
EXIT_INTERNAL = 3
# What a shell reports for a writer killed by SIGPIPE (128 + 13). Chosen over 0 because output
# cut short is not success (`rlrollout validate DIR | head` must not read as "valid" under
# `set -o pipefail`), and over 1/2 because those mean findings / usage errors here.
EXIT_BROKEN_PIPE = 141
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C


class UsageError(Exception):
    """A command-line mistake the user can fix: one line on stderr, exit 2."""


BUILT_IN_KEY = "rl-reference-key"  # the reference deployment's public default key


def _size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 5GB, 512MiB, 1000000)")
    unit = (m.group(2) or "").upper().replace("I", "").rstrip("B")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(unit or " "))


def _cmd_validate(args: argparse.Namespace) -> int:
    """Exit 0 valid, 1 findings, 2 usage or I/O error, 3 internal error; every error is one line
    on stderr. Whatever the snapshot or the signal holds is a finding or a usage error, so an
    exception from the validation itself is a bug (exit 3), never a verdict."""
    try:
        signal = _validate_inputs(args)
    except (UsageError, ValueError, OSError) as e:  # the signal file, or a directory that is none
        return _validate_error(f"error: {e}", EXIT_USAGE)
    try:
        return _validate(args, signal)
    except BrokenPipeError:
        raise  # main() ends quietly
    except OSError as e:  # the snapshot directory itself cannot be listed
        return _validate_error(f"error: {e}", EXIT_USAGE)
    except Exception as e:
        return _validate_error(f"internal error: {type(e).__name__}: {_text_of(e)} (please report)", EXIT_INTERNAL)


def _validate_inputs(args: argparse.Namespace) -> dict[str, Any] | None:
    from pytest_rlrollout.snapshot.validate import load_signal

    for option, path in (("SNAPSHOT", args.snapshot), ("--base", args.base), ("--parent", args.parent)):
        if path is not None and not os.path.isdir(path):
            raise UsageError(f"{option} {path}: not a directory")
    return load_signal(args.signal) if args.signal else None


def _validate(args: argparse.Namespace, signal: dict[str, Any] | None) -> int:
    from pytest_rlrollout.snapshot import untrusted
    from pytest_rlrollout.snapshot.validate import validate

    report = validate(
        args.snapshot,
        base=args.base,
        parent=args.parent,
        signal=signal,
        identity=args.identity,
        base_model=tuple(args.base_model),
        hf_config=not args.no_transformers,
    )
    level = args.level.upper()
    doc = report.as_dict(level)
    hints = _validate_hints(report, args)
    if args.format == "json":
        # JSON escapes what text would have to: ensure_ascii turns every control character and
        # undecodable file name (a lone surrogate) into \uXXXX
        out = json.dumps({**doc, "hints": hints}, indent=2)
    else:
        out = "\n".join([report.text(level), *(untrusted.printable(f"hint: {h}") for h in hints)])
    _print(out, sys.stdout)
    # one value decides both, so the exit code and the JSON's `valid` cannot disagree
    return EXIT_OK if doc["valid"] else EXIT_FINDINGS


def _validate_error(what: str, code: int) -> int:
    """One line on stderr, whatever `what` holds (a path or a message can hold newlines and
    terminal escapes, or be megabytes long)."""
    from pytest_rlrollout.snapshot import untrusted

    _print(f"rlrollout validate: {untrusted.brief_text(untrusted.printable(what), 1000)}", sys.stderr)
    return code


def _print(text: str, stream: Any) -> None:
    """`text` on `stream`, a character its encoding lacks (an ASCII terminal, a name in é) shown
    as its escape rather than failing the command."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    print(text.encode(encoding, "backslashreplace").decode(encoding), file=stream)


def _text_of(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # an exception whose own message fails to build
        return "(no message)"


def _validate_hints(report: Report, args: argparse.Namespace) -> list[str]:
    """What to run next, for the two mistakes whose findings do not say it themselves."""
    hints = []
    snapshot = shlex.quote(str(args.snapshot))
    diff = args.parent is None and (report.kind == "incremental" or _holds_arc2_payloads(args.snapshot))
    if diff:
        # without the parent the diff is judged as a full snapshot (or half-judged), so every
        # U8 payload shows up as a wrong tensor
        hints.append(
            f"{snapshot} holds ARC2 diff payloads (1-D U8 tensors with Adler-32 checksums): "
            f"pass --parent PARENT, the snapshot the diff applies to"
        )
    elif report.of("SNAP-INDEX-2"):
        hints.append(
            f"shards mix layers (as save_pretrained's size-based split does): "
            f"`rlrollout export {snapshot} DST` re-lays the checkpoint one layer per shard"
        )
    return hints


def _holds_arc2_payloads(snapshot: Path) -> bool:
    """Whether every tensor of every safetensors file is an ARC2 payload: 1-D U8 with a decimal
    checksum under its name in `__metadata__` (what `rlrollout delta` writes). Files are read as
    the validator reads them: confined to the snapshot, regular files only, within its bounds."""
    from pytest_rlrollout.snapshot import safetensors_io as st
    from pytest_rlrollout.snapshot.layout import SnapshotDir
    from pytest_rlrollout.snapshot.validate.core import MAX_FILES

    d = SnapshotDir(snapshot)
    files = d.safetensors_files
    if not files or len(files) > MAX_FILES:
        return False
    for name in files:
        if d.unreadable(name) is not None:
            return False
        try:
            header = st.read_header(d.path(name))
        except (OSError, st.HeaderError):
            return False
        if not header.tensors:
            return False
        for tensor, t in header.tensors.items():
            if t.dtype != "U8" or len(t.shape) != 1 or not header.metadata.get(tensor, "").isdigit():
                return False
    return True


def _cmd_export(args: argparse.Namespace) -> int:
    from pytest_rlrollout.snapshot import build

    dst = build.export_checkpoint(args.src, args.dst, max_bytes=args.max_shard_size)
    print(f"wrote {dst}")
    return EXIT_OK


def _cmd_delta(args: argparse.Namespace) -> int:
    from pytest_rlrollout.snapshot import build

    signal = build.make_incremental(args.parent, args.target, args.out, threads=args.threads)
    print(json.dumps(signal, indent=2))
    return EXIT_OK


def _cmd_apply(args: argparse.Namespace) -> int:
    from pytest_rlrollout.snapshot import build

    print(f"wrote {build.apply_incremental(args.parent, args.diff, args.out, threads=args.threads)}")
    return EXIT_OK


def _cmd_make_base(args: argparse.Namespace) -> int:
    from pytest_rlrollout.snapshot import tiny_moe

    path = tiny_moe.make_base(args.dir)
    print(f"wrote {path} (model {tiny_moe.MODEL_NAME})")
    return EXIT_OK


def _fault_switches() -> dict[str, str]:
    """Every fault switch `serve --fault` takes, with what it does (behaviours included)."""
    from pytest_rlrollout.reference.faults import BEHAVIOURS, FAULTS

    return FAULTS | BEHAVIOURS


def _check_faults(names: Sequence[str]) -> frozenset[str]:
    """The switches; a usage error naming the unknown ones."""
    unknown = [n for n in dict.fromkeys(names) if n not in _fault_switches()]
    if unknown:
        raise UsageError(
            f"--fault: unknown fault switch(es) {', '.join(unknown)} (`rlrollout serve --list-faults` lists them)"
        )
    return frozenset(names)


def _remove_tree(path: Path) -> None:
    import shutil

    try:
        shutil.rmtree(path)
    except OSError as e:
        print(f"rlrollout serve: could not remove the temporary bucket {path}: {e}", file=sys.stderr)


def _stop_on(signum: int, stop: threading.Event, cleanup: contextlib.ExitStack) -> None:
    """Make `signum` set `stop` until `cleanup` unwinds. A signal ignored on purpose stays ignored:
    `nohup rlrollout serve &` must survive the terminal closing (SIGHUP) and Ctrl-C (SIGINT)."""
    if signal.getsignal(signum) == signal.SIG_IGN:
        return
    previous = signal.signal(signum, lambda *_: stop.set())
    if previous is not None:  # None: a handler set outside Python, which cannot be put back
        cleanup.callback(signal.signal, signum, previous)


def _shown(key: str | None, option: str) -> str | None:
    """A key as `serve` prints it: the built-in one is public; one of the user's own never shows."""
    return key if key in (None, BUILT_IN_KEY) else f"<the {option} you chose>"


def _cmd_serve(args: argparse.Namespace) -> int:
    import tempfile

    if args.list_faults:
        switches = _fault_switches()
        width = max(map(len, switches), default=0)
        print("\n".join(f"{name:{width}}  {what}" for name, what in switches.items()))
        return EXIT_OK
    faults = _check_faults(args.fault)  # before anything is built, bound or created
    vllm = args.engine in ("vllm", "sglang")  # a self-hosted engine: one server, swapped through its RL routes
    if vllm and args.transition.upper() != "ASYNC":
        raise UsageError(f"--engine {args.engine}: the swap pauses generation and the requests in flight continue "
                         "(ASYNC); --transition sync is a Fireworks setting")  # fmt: skip
    if args.engine == "coreweave" and args.transition.upper() != "ASYNC":
        raise UsageError("--engine coreweave: CoreWeave documents TRANSITION_MODE_ASYNC only")
    if args.control_api_key is not None and args.engine != "coreweave":
        raise UsageError("--control-api-key is the key of CoreWeave's hot-load API (--engine coreweave)")
    if args.enable_return_routed_experts and not vllm:
        raise UsageError("--enable-return-routed-experts is vLLM's and SGLang's flag (--engine vllm|sglang); the "
                         "Fireworks dialect returns routing matrices when a request asks for them")  # fmt: skip

    from pytest_rlrollout.reference import reference_deployment
    from pytest_rlrollout.reference.settings import OBSERVABLE_PACE, SGLANG_VERSION, VLLM_VERSION

    options = dict(
        engine=args.engine,
        transition=args.transition.upper(),
        faults=faults,
        stagger=args.stagger,
        routed_experts=args.enable_return_routed_experts,
        **{k: OBSERVABLE_PACE[k] if getattr(args, k) is None else getattr(args, k) for k in OBSERVABLE_PACE},
    )
    # each dialect's defaults: 2 replicas and the built-in key on Fireworks; one engine and no key on vLLM
    given = (("replicas", args.replicas), ("api_key", args.api_key), ("control_api_key", args.control_api_key))
    options |= {k: v for k, v in given if v is not None}
    if not vllm:
        options.setdefault("api_key", BUILT_IN_KEY)
    # the built-in key is public; a key of the user's own is never echoed
    key = options.get("api_key")
    shown_key = _shown(key, "--api-key")
    stop = threading.Event()
    with contextlib.ExitStack() as cleanup:
        # SIGTERM (kill, systemd, docker stop) and SIGHUP (terminal closed) end the server the
        # way Ctrl-C does, so the cleanup below runs. Installed before there is anything to clean
        # up and restored last (an in-process caller keeps its own handlers).
        for signum in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if signum is not None:
                _stop_on(signum, stop, cleanup)
        if args.bucket is None:
            bucket = Path(tempfile.mkdtemp(prefix="rlrollout-bucket-"))
            # removed after the deployment stops (the stack unwinds last-in first-out); a
            # --bucket the user named is theirs and never removed
            cleanup.callback(_remove_tree, bucket)
        else:
            bucket = args.bucket
        dep = cleanup.enter_context(reference_deployment(bucket, host=args.host, port=args.port, **options))
        # From here on Ctrl-C is a request to stop, like SIGTERM: set before anything is printed,
        # so it never lands as a KeyboardInterrupt between the output and the wait (exit 0 either
        # way). Restored first on the way out: a second Ctrl-C during shutdown interrupts it.
        _stop_on(signal.SIGINT, stop, cleanup)
        replicas = len(dep.deployment.replicas)
        base = bucket / dep.settings.base_identity
        if vllm:
            named = [f"base URL:   {dep.base_url}", f"model:      {dep.model}", f"bucket:     {bucket}"]
            command = (f"--rl-base-url={dep.base_url} --rl-model={dep.model} --rl-engine={args.engine} --rl-allow-hot-load"
                       f" --rl-bucket-url={bucket} --rl-base-snapshot={base}"
                       + (f" --rl-api-key={shown_key}" if key is not None else ""))  # fmt: skip
            serving = (f"vLLM {VLLM_VERSION}'s dialect" if args.engine == "vllm"
                       else f"SGLang {SGLANG_VERSION}'s dialect")  # fmt: skip
        elif args.engine == "coreweave":
            # the gateway and the hot-load API on one host here; a real deployment has two
            control_key = options.get("control_api_key") or key
            shown_control = _shown(control_key, "--control-api-key")
            deployment = dep.settings.deployment_id
            named = [f"gateway:    {dep.base_url}", f"hot-loads:  {dep.base_url}", f"deployment: {deployment}",
                     f"model:      {dep.model}", f"bucket:     {bucket}"]  # fmt: skip
            command = (f"--rl-deployment={deployment} --rl-base-url={dep.base_url} --rl-control-url={dep.base_url}"
                       f" --rl-model={dep.model} --rl-engine=coreweave --rl-api-key={shown_key} --rl-allow-hot-load"
                       f" --rl-bucket-url={bucket} --rl-base-snapshot={base}"
                       # no policy version on CoreWeave's chunks: a stream shows it crossed a swap
                       # only by outlasting the whole rollout (every replica, one at a time)
                       " --rl-long-stream-tokens=512 --rl-swap-timeout=10")  # fmt: skip
            named.append(f"environment: COREWEAVE_API_KEY={shown_control}")
            serving = "CoreWeave's v1alpha1 dialect, TRANSITION_MODE_ASYNC"
        else:
            named = [f"base URL:   {dep.base_url}", f"deployment: {dep.name}", f"model:      {dep.model}",
                     f"bucket:     {bucket}"]  # fmt: skip
            command = (f"--rl-deployment={dep.name} --rl-base-url={dep.base_url} --rl-model={dep.model}"
                       f" --rl-api-key={shown_key} --rl-allow-hot-load --rl-bucket-url={bucket}"
                       f" --rl-base-snapshot={base} --rl-transition={options['transition']}"
                       # this deployment's pace: a swap lands inside 64 tokens and takes well under 10 s
                       " --rl-long-stream-tokens=64 --rl-swap-timeout=10")  # fmt: skip
            serving = options["transition"]
        print("\n".join([*named, f"conformance: rlrollout conformance {command}"]))
        print(f"serving {dep.settings.base_identity} on {replicas} replica(s), {serving}", flush=True)
        stop.wait()
    return EXIT_OK


NUMERICS_PROMPT_TOKENS = 16  # token ids per prompt: a context to condition on, short beside the completions


def _cmd_numerics(args: argparse.Namespace) -> int:
    """Sample rollouts from a deployment, score the same tokens with a local forward pass of the
    weights it serves, print the figures (and write them with --out). Exit 0 when every threshold
    holds, 1 naming each one crossed, 2 for a usage or connection error (one line, never the key)."""
    from pytest_rlrollout.contract.moe import moe_shape
    from pytest_rlrollout.numerics.rollouts import compare
    from pytest_rlrollout.numerics.scorer import local_scorer
    from pytest_rlrollout.remote.fingerprint import canary

    if not 0.0 <= args.min_route_agreement <= 1.0:
        raise UsageError(f"--min-route-agreement {args.min_route_agreement:g}: a fraction in [0, 1] (0.9 is 90%)")
    target = _numerics_target(args)
    config = _snapshot_config(args.snapshot)
    try:  # before sampling: a scorer that cannot load is known without asking the deployment anything
        scorer = local_scorer(args.snapshot, args.scorer, args.device)
    except (RuntimeError, ValueError, OSError) as e:
        raise UsageError(f"--scorer {args.scorer}: {_one_line(e)}") from None
    shape = None if args.no_routing else moe_shape(config)  # routing is asked of MoE models only
    prompts = canary(config.get("vocab_size"), args.prompts, NUMERICS_PROMPT_TOKENS)
    rollouts, shape = _numerics_sample(args, target, shape, prompts)
    policies = sorted({v for r in rollouts for v in r.versions})
    if len(policies) > 1:
        print(f"rlrollout numerics: note: the rollouts name {len(policies)} policy versions "
              f"({', '.join(policies)}): the deployment swapped while sampling, and --snapshot holds one of them at "
              "most", file=sys.stderr)  # fmt: skip
    try:
        figures, alignment = compare(rollouts, scorer, progress=_progress("scoring"))
    except (ValueError, IndexError) as e:  # token ids or routing the local weights do not have
        raise UsageError(f"--snapshot {args.snapshot}: the rollouts do not score with it ({_one_line(e)})") from None
    crossed = _crossed(figures, args)
    _print("\n".join(_numerics_lines(args, target, scorer.name, policies, figures, alignment)), sys.stdout)
    if args.out is not None:
        _write_numerics(args, target, scorer.name, policies, figures, alignment, crossed)
    if figures.route_agreement is None and shape is not None:
        print(f"rlrollout numerics: note: routing not compared: the {scorer.name} scorer reports none", file=sys.stderr)
    for c in crossed:
        _print(f"threshold crossed: {c}", sys.stdout)
    if not crossed:
        print("every threshold holds")
    return EXIT_FINDINGS if crossed else EXIT_OK


def _numerics_target(args: argparse.Namespace) -> Target:
    """The deployment as the suite's preflight names it: a Fireworks deployment when --deployment
    is given, else the OpenAI-compatible server at --base-url."""
    from pytest_rlrollout.remote.client import Target
    from pytest_rlrollout.suite.options import DEFAULT_BASE_URL

    if args.deployment is None and args.base_url is None:
        raise UsageError("pass --deployment accounts/<a>/deployments/<d> and/or --base-url URL")
    if not args.model:
        raise UsageError("pass --model (the model the deployment serves)")
    key = args.api_key or os.environ.get("FIREWORKS_API_KEY") or ""
    if args.deployment is not None and not key:
        raise UsageError(f"--deployment {args.deployment}: pass --api-key or set FIREWORKS_API_KEY")
    try:
        return Target(args.deployment, (args.base_url or DEFAULT_BASE_URL).rstrip("/"), args.model, key,
                      inference_url=args.inference_url or "",
                      engine="fireworks" if args.deployment is not None else "openai")  # fmt: skip
    except ValueError as e:
        raise UsageError(f"--deployment: {e}") from None


def _snapshot_config(snapshot: Path) -> dict[str, Any]:
    """The snapshot's config.json: the vocabulary the prompts are drawn from, and the MoE shape."""
    if not snapshot.is_dir():
        raise UsageError(f"--snapshot {snapshot}: not a directory")
    try:
        config = json.loads((snapshot / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--snapshot {snapshot}: no readable config.json ({_one_line(e)})") from None
    if not isinstance(config, dict):
        raise UsageError(f"--snapshot {snapshot}: config.json is not a JSON object")
    return config


def _numerics_sample(
    args: argparse.Namespace, target: Target, shape: MoeShape | None, prompts: list[list[int]]
) -> tuple[list[Rollout], MoeShape | None]:
    """One sampled completion per prompt, with logprobs, and routing matrices when `shape` is given
    and the engine returns them behind a server flag it has on; the shape routing was asked with."""
    import httpx

    from pytest_rlrollout.contract.capabilities import CAPABILITIES
    from pytest_rlrollout.numerics.rollouts import RolloutError, sample
    from pytest_rlrollout.remote.client import DeploymentClient
    from pytest_rlrollout.remote.discovery import PreflightError, preflight
    from pytest_rlrollout.remote.drivers import driver_for
    from pytest_rlrollout.remote.limits import LIVE_LIMITS, LimitExceeded

    with DeploymentClient(target, timeout=args.timeout, limits=LIVE_LIMITS) as client:
        try:  # the engine, as the suite's preflight decides it: its driver samples on its wire
            engine, decided = preflight(client, None if args.engine == "auto" else args.engine)
            print(f"rlrollout numerics: engine {engine} ({decided})", file=sys.stderr)
            driver = driver_for(engine, client)
            if engine == "vllm":  # the spans of vLLM's generate route name each rollout's policy
                found = driver.discover(transition=None, decided=decided)
                driver.adopt(found)
                if shape is not None and not found.has("routing_matrix"):  # a server flag, off
                    flag = CAPABILITIES["routing_matrix"].flag(engine)
                    print(f"rlrollout numerics: note: routing not compared: {found.seen['routing_matrix']} (vLLM "
                          f"returns it with {flag})", file=sys.stderr)  # fmt: skip
                    shape = None
            rollouts = sample(driver, prompts, args.tokens, shape=(shape.layers, shape.k) if shape else None,
                              seed=args.seed, progress=_progress("sampling"))  # fmt: skip
            return rollouts, shape
        except PreflightError as e:
            raise UsageError(f"{target.name}: {_one_line(e)}") from None
        except (httpx.HTTPError, LimitExceeded, RolloutError) as e:
            # the client's messages never hold the key (an echo of it is redacted)
            hint = " (--no-routing compares logprobs only)" if shape and "routing_matrix" in str(e) else ""
            raise UsageError(f"{target.name}: {_one_line(e)}{hint}") from None


def _progress(what: str) -> Callable[[int, int], None]:
    """`what i/n` on stderr: rewritten in place on a terminal, a line each otherwise (a log)."""
    tty = sys.stderr.isatty()

    def show(i: int, n: int) -> None:
        if tty:
            print(f"\r{what} {i}/{n}", end="\n" if i == n else "", file=sys.stderr, flush=True)
        else:
            print(f"{what} {i}/{n}", file=sys.stderr, flush=True)

    return show


def _one_line(e: BaseException, limit: int = 500) -> str:
    """An error's message as one printable line: it may quote the deployment's answer."""
    from pytest_rlrollout.snapshot import untrusted

    return untrusted.brief_text(" ".join(untrusted.printable(_text_of(e)).split()), limit)


def _crossed(figures: Figures, args: argparse.Namespace) -> list[str]:
    """Each threshold the figures cross, as `figure value > --option limit` (a NaN crosses)."""
    out = []
    if not figures.k3_kl <= args.max_kl:
        out.append(f"k3 KL {figures.k3_kl:.3g} > --max-kl {args.max_kl:g}")
    if args.max_logprob_delta is not None and not figures.max_abs <= args.max_logprob_delta:
        out.append(f"max |Δlogprob| {figures.max_abs:.3g} > --max-logprob-delta {args.max_logprob_delta:g}")
    if figures.route_agreement is not None and not figures.route_agreement >= args.min_route_agreement:
        out.append(f"routing agreement {figures.route_agreement:.3%} < --min-route-agreement "
                   f"{args.min_route_agreement:g}")  # fmt: skip
    return out


def _numerics_lines(args: argparse.Namespace, target: Target, scorer: str, policies: list[str], figures: Figures,
                    alignment: str | None) -> list[str]:  # fmt: skip
    out = [f"deployment               {target.name}",
           f"local weights            {args.snapshot} ({scorer} scorer on {args.device})",
           f"rollouts                 {args.prompts} prompts x {args.tokens} tokens, seed {args.seed}"
           + (f", policy {', '.join(policies)}" if policies else ""),
           *figures.lines()]  # fmt: skip
    if alignment is not None:
        out.append(f"routing alignment        {alignment}")
    return out


def _write_numerics(args: argparse.Namespace, target: Target, scorer: str, policies: list[str], figures: Figures,
                    alignment: str | None, crossed: list[str]) -> None:  # fmt: skip
    """numerics.json and the pictures (numerics-<name>.png) into --out."""
    from pytest_rlrollout.numerics.pictures import pictures, unavailable

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, png in pictures(figures).items():
        (out / f"numerics-{name}.png").write_bytes(png)
        written.append(f"numerics-{name}.png")
    why = unavailable()
    if why is not None:
        print(f"rlrollout numerics: note: no pictures: {why}", file=sys.stderr)
    thresholds = {k: getattr(args, k) for k in ("max_kl", "max_logprob_delta", "min_route_agreement")}
    doc = {
        "deployment": target.name,
        "snapshot": str(args.snapshot),
        "scorer": scorer,
        "device": args.device,
        "prompts": args.prompts,
        "tokens": args.tokens,
        "seed": args.seed,
        "policies": policies,
        "thresholds": thresholds,
        "crossed": crossed,
        "figures": {**figures.as_dict(), "alignment": alignment},
        "pictures": written,
    }
    (out / "numerics.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out / 'numerics.json'}" + (f" and {len(written)} pictures" if written else ""))


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"not a positive whole number: {text!r}")
    return n


def _cmd_clauses(args: argparse.Namespace) -> int:
    from pytest_rlrollout.contract import catalogue

    cat = catalogue()
    if args.format == "md":
        if args.area:
            raise UsageError("--format md prints the whole contract; drop --area")
        from pytest_rlrollout.suite.docs import contract_markdown

        sys.stdout.write(contract_markdown())
        return EXIT_OK
    area = args.area.upper() if args.area else None
    if area is not None and area not in cat.areas:
        raise UsageError(f"--area {args.area}: no such area (areas: {', '.join(cat.areas)})")
    chosen = [c for c in cat if area is None or c.area == area]
    if args.format == "json":
        print(json.dumps([c.__dict__ for c in chosen], indent=2))
    else:
        for c in chosen:
            print(f"{c.id:24} {c.level:6} {c.rule}")
    return EXIT_OK


def _cmd_matrix(args: argparse.Namespace) -> int:
    from pytest_rlrollout.suite.matrix import MatrixError, html, load, markdown

    try:  # the reports' evidence linked from where the page is written
        columns = load(args.reports, args.out.parent if args.out is not None else None)
    except MatrixError as e:
        raise UsageError(str(e)) from None
    if args.out is None:
        sys.stdout.write(markdown(columns))
        return EXIT_OK
    for suffix, text in ((".md", markdown(columns)), (".html", html(columns))):
        path = args.out.with_name(args.out.name + suffix)
        path.write_text(text)
        print(f"wrote {path}")
    return EXIT_OK


# The bounds are the validator's constants (snapshot.untrusted, safetensors_io, validate.core),
# written out so that `--help` imports none of it; a test holds the two together.
VALIDATE_DESCRIPTION = (
    "Checks a snapshot directory against every SNAP clause; reads only, writes nothing. Exit status: 0 valid, "
    "1 findings, 2 usage or I/O error, 3 internal error (a bug in the validator: please report it). "
    "The snapshot and the signal are read as untrusted input, within bounds far above real snapshots; what "
    "exceeds them is a finding (a usage error for the --signal file): JSON files of at most 32 MiB (the signal "
    "1 MiB), nested at most 64 deep, with at most 2097152 items; safetensors headers of at most 32 MiB and "
    "65536 tensors (names of at most 1024 characters, rank at most 64); at most 4096 safetensors files and "
    "262144 tensors per snapshot; at most 1000 findings per clause. FIFOs, sockets, devices, directories and "
    "symlinks that loop or leave the snapshot are named, never opened. Text output prints names escaped "
    "(\\n, \\x1b); --format json is JSON."
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlrollout", description="RL-rollout hot-load deployment contract tools")
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser(
        "validate",
        help="check a snapshot directory against every SNAP clause (reads only)",
        description=VALIDATE_DESCRIPTION,
    )
    v.add_argument("snapshot", type=Path)
    v.add_argument("--base", type=Path, help="the base model snapshot (enables config/coverage/tokenizer comparisons)")
    v.add_argument("--parent", type=Path, help="the parent snapshot: SNAPSHOT is an ARC2 diff of it")
    v.add_argument("--signal", type=Path, help="the hot-load request body (JSON) that will announce the snapshot")
    v.add_argument("--identity", help="the identity it will be signalled under (default: the directory name)")
    v.add_argument("--base-model", action="append", default=[], help="a name adapter_config.json may use for the base")
    v.add_argument(
        "--level", choices=["must", "should"], default="should", help="fail on MUST findings only, or on SHOULD too"
    )
    v.add_argument("--format", choices=["text", "json"], default="text")
    v.add_argument("--no-transformers", action="store_true", help="do not ask transformers whether config.json loads")
    v.set_defaults(run=_cmd_validate)

    e = sub.add_parser("export", help="re-lay a Hugging Face checkpoint as a hot-load snapshot")
    e.add_argument("src", type=Path)
    e.add_argument("dst", type=Path)
    e.add_argument("--max-shard-size", type=_size, default=5 * 1024**3, help="size cap per shard (default 5GiB)")
    e.set_defaults(run=_cmd_export)

    d = sub.add_parser("delta", help="write the ARC2 diff PARENT -> TARGET into OUT and print its signal body")
    d.add_argument("parent", type=Path)
    d.add_argument("target", type=Path)
    d.add_argument("out", type=Path)
    d.add_argument("--threads", type=int)
    d.set_defaults(run=_cmd_delta)

    a = sub.add_parser("apply", help="materialise the full snapshot an ARC2 diff describes")
    a.add_argument("parent", type=Path)
    a.add_argument("diff", type=Path)
    a.add_argument("out", type=Path)
    a.add_argument("--threads", type=int)
    a.set_defaults(run=_cmd_apply)

    m = sub.add_parser("make-base", help="write the tiny reference Qwen3-MoE base snapshot")
    m.add_argument("dir", type=Path)
    m.set_defaults(run=_cmd_make_base)

    sv = sub.add_parser("serve", help="run the reference deployment (a hot-load deployment of the tiny MoE)")
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=0, help="0 picks a free port")
    sv.add_argument("--bucket", type=Path, help="snapshot bucket directory (default: a new temporary one)")
    sv.add_argument("--engine", choices=["fireworks", "vllm", "sglang", "coreweave"], default="fireworks",
                    help="the wire it speaks: Fireworks' hot-load API, vLLM 0.32's or SGLang 0.5.23's RL routes "
                         "(one engine, the model served as 'tiny'), or CoreWeave's v1alpha1 hot-load API beside an "
                         "OpenAI-compatible gateway")  # fmt: skip
    sv.add_argument("--replicas", type=int, help="default: 2 (fireworks, coreweave), 1 (vllm, sglang)")
    sv.add_argument("--transition", choices=["async", "sync", "ASYNC", "SYNC"], default="async")
    sv.add_argument("--api-key", help="default: rl-reference-key (fireworks, coreweave), none asked for (vllm, sglang)")
    sv.add_argument("--control-api-key", help="coreweave: a key of its own for the hot-load API (default: --api-key)")
    sv.add_argument("--enable-return-routed-experts", action="store_true",
                    help="vllm, sglang: completions carry routed_experts (as vLLM's flag on a GPU server; its CPU build has "
                         "none, and neither has this dialect by default)")  # fmt: skip
    sv.add_argument(
        "--fault",
        nargs="+",
        action="extend",
        default=[],
        metavar="SWITCH",
        help="fault switches to turn on (break a clause on purpose): a clause ID, ID:VARIANT, or a behaviour name; "
        "takes several and repeats",
    )
    sv.add_argument("--list-faults", action="store_true", help="list every fault switch with what it does, and exit")
    # the delays default to the pace at which the conformance suite can observe swaps
    sv.add_argument("--load-delay", type=float, help="seconds each replica takes to load a snapshot")
    sv.add_argument("--stagger", type=float, default=0.0, help="extra load seconds per replica index (staggered swaps)")
    sv.add_argument("--swap-delay", type=float, help="seconds a replica pauses at the swap")
    sv.add_argument("--token-delay", type=float, help="seconds per decode step (0: full speed)")
    sv.set_defaults(run=_cmd_serve)

    nm = sub.add_parser(
        "numerics",
        help="compare a deployment's logprobs and routing with a local forward pass of the weights it serves",
        description="Samples one completion per prompt (token-id prompts, temperature 1) with logprobs and, for an "
        "MoE model, routing matrices; scores the same tokens with a local forward pass of --snapshot; prints the "
        "figures (mean and max |logprob delta|, k3 KL, ratios outside [0.5, 2], routing agreement overall and per MoE "
        "layer). Exit status: 0 every threshold holds, 1 a threshold is crossed (each one named), 2 usage or "
        "connection error.",
    )
    nm.add_argument("--deployment", metavar="NAME", help="accounts/<a>/deployments/<d> (a Fireworks deployment)")
    nm.add_argument("--base-url", metavar="URL", help="the API base (default https://api.fireworks.ai with "
                    "--deployment; without it, an OpenAI-compatible server)")  # fmt: skip
    nm.add_argument("--model", help="the model the deployment serves")
    nm.add_argument("--engine", choices=["auto", "fireworks", "vllm", "openai"], default="auto",
                    help="whose wire the deployment speaks (default auto: decided as the suite decides it)")  # fmt: skip
    nm.add_argument("--api-key", metavar="KEY", help="default: $FIREWORKS_API_KEY")
    nm.add_argument("--inference-url", metavar="URL", help="where /v1/completions is (default: from --base-url)")
    nm.add_argument("--snapshot", type=Path, required=True, metavar="DIR",
                    help="a local copy of the weights the deployment serves (config.json and safetensors)")  # fmt: skip
    nm.add_argument("--prompts", type=_count, default=8, metavar="N", help="prompts, one completion each (default 8)")
    nm.add_argument("--tokens", type=_count, default=32, metavar="N", help="tokens generated per prompt (default 32)")
    nm.add_argument("--scorer", choices=["auto", "numpy", "transformers"], default="auto",
                    help="the local forward pass (default auto: the numpy engine for small models on the CPU, else "
                         "transformers)")  # fmt: skip
    nm.add_argument("--device", default="cpu", help="where the transformers scorer runs (default cpu; cuda, cuda:1)")
    nm.add_argument("--seed", type=int, default=0, help="the sampling seed of the first prompt (prompt i: seed + i)")
    nm.add_argument("--no-routing", action="store_true", help="compare logprobs only (no routing matrices asked)")
    nm.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each read (default 120)")
    nm.add_argument("--out", type=Path, metavar="DIR", help="write numerics.json and the pictures (PNG) here")
    nm.add_argument("--max-kl", type=float, default=1e-3, metavar="X", help="largest k3 KL (default 1e-3)")
    nm.add_argument("--max-logprob-delta", type=float, metavar="X", help="largest |logprob delta| (default: none)")
    nm.add_argument("--min-route-agreement", type=float, default=0.9, metavar="F",
                    help="least routing agreement over (layer, token), a fraction (default 0.9)")  # fmt: skip
    nm.set_defaults(run=_cmd_numerics)

    cf = sub.add_parser(
        "conformance",
        help="run the installed conformance suite (any pytest option, e.g. --rl-deployment=..., -n 2)",
        description="Runs the conformance tests installed with the package. Module names (hot_load, swap, "
        "cache, ...) select modules; every other argument goes to pytest.",
    )
    cf.add_argument("pytest_args", nargs=argparse.REMAINDER)
    cf.set_defaults(run=_cmd_conformance)

    c = sub.add_parser("clauses", help="list the contract's clauses (--format md: the contract document)")
    c.add_argument("--area", help="only this area (SNAP, HL, SWAP, CACHE, SESS, VER, R3, INF, NUM)")
    c.add_argument("--format", choices=["text", "json", "md"], default="text")
    c.set_defaults(run=_cmd_clauses)

    mx = sub.add_parser("matrix", help="render clause x engine from the suite's reports (--rl-report JSON files)",
                        description="One column per report (engine, version, the server flags its answers showed, "
                        "date, how it was run); one row per clause, headed by area; totals per column. Reports "
                        "judged by different contract versions are refused.")  # fmt: skip
    mx.add_argument("reports", nargs="+", type=Path, metavar="REPORT.json")
    mx.add_argument(
        "--out", type=Path, metavar="STEM", help="write STEM.md and STEM.html (default: Markdown on stdout)"
    )
    mx.set_defaults(run=_cmd_matrix)
    return p


def _cmd_conformance(args: argparse.Namespace) -> int:
    import pytest

    from pytest_rlrollout.suite.options import CONFORMANCE as suite

    modules = {p.stem.removeprefix("test_"): p for p in suite.glob("test_*.py")}
    chosen = [str(modules[a.removeprefix("test_").removesuffix(".py")]) for a in args.pytest_args
              if a.removeprefix("test_").removesuffix(".py") in modules]  # fmt: skip
    rest = [a for a in args.pytest_args if a.removeprefix("test_").removesuffix(".py") not in modules]
    return int(pytest.main([*(chosen or [str(suite)]), "-p", "no:cacheprovider", f"--rootdir={suite}", *rest]))


class _OptionTable:
    """Stands in for pytest's Parser when `add_options` runs, and puts each option it registers on
    an argparse parser instead: the `--rl-*` help comes from the plugin's one table of options."""

    def __init__(self, parser: argparse.ArgumentParser):
        self._parser = parser
        self._groups: dict[str, Any] = {}
        self.ini: list[tuple[str, str]] = []

    def getgroup(self, name: str, description: str = "", after: str | None = None) -> _OptionTable._Group:
        if name not in self._groups:
            self._groups[name] = self._parser.add_argument_group(description or name)
        return _OptionTable._Group(self._groups[name])

    def addoption(self, *opts: str, **attrs: Any) -> None:
        self.getgroup("custom options").addoption(*opts, **attrs)

    def addini(self, name: str, help: str, *args: Any, **kwargs: Any) -> None:
        self.ini.append((name, help))

    class _Group:
        def __init__(self, group: Any):
            self._group = group

        def addoption(self, *opts: str, **attrs: Any) -> None:
            self._group.add_argument(*opts, **attrs)


def conformance_help() -> str:
    """`rlrollout conformance --help`: the usage and every `--rl-*` option the plugin registers."""
    from pytest_rlrollout.suite.options import CONFORMANCE, add_options

    modules = ", ".join(sorted(p.stem.removeprefix("test_") for p in CONFORMANCE.glob("test_*.py")))
    description = (
        "Runs the conformance suite installed with the package, by default against the bundled reference "
        f"deployment. MODULE selects modules ({modules}); every other argument goes to pytest unchanged "
        "(-n 2, -k EXPR, -x, ...: `pytest --help` lists pytest's own options)."
    )
    p = argparse.ArgumentParser(
        prog="rlrollout conformance",
        usage="rlrollout conformance [MODULE ...] [--rl-OPTION ...] [pytest options]",
        description=description,
        add_help=False,
    )
    table = _OptionTable(p)
    add_options(table)  # type: ignore[arg-type]  # duck-typed: getgroup/addoption/addini
    text = p.format_help()
    if table.ini:
        width = max(len(name) for name, _ in table.ini)
        lines = [f"  {name:{width}}  {help_}" for name, help_ in table.ini]
        text += "\nini-file settings (pytest.ini, [tool.pytest.ini_options]):\n" + "\n".join(lines) + "\n"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        code = _main(argv)
        # flush here, not at interpreter exit, so a closed pipe surfaces inside this handler
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader went away (`| head`). Point stdout at /dev/null so the interpreter's own
        # flush at exit finds nowhere to fail and prints no "Exception ignored" noise.
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _main(argv: list[str]) -> int:
    if argv[:1] == ["conformance"]:
        if argv[1:2] in (["-h"], ["--help"]):
            sys.stdout.write(conformance_help())
            return EXIT_OK
        # everything after the word goes to pytest untouched (argparse would claim -q, -n, ...)
        return _cmd_conformance(argparse.Namespace(pytest_args=argv[1:]))
    args = parser().parse_args(argv)
    from pytest_rlrollout.snapshot.arc2 import DeltaError
    from pytest_rlrollout.snapshot.build import SnapshotError

    try:
        return args.run(args)
    except BrokenPipeError:
        raise  # an OSError, but not a failure of the command: main() ends quietly
    except (UsageError, SnapshotError, DeltaError, NotADirectoryError, FileNotFoundError, ValueError, OSError) as e:
        print(f"rlrollout {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
