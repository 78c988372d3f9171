"""Checks on config.json: SNAP-CONFIG-1 (a Hugging Face config), SNAP-CONFIG-2 (equals the base's)."""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from pytest_rlrollout.snapshot import untrusted
from pytest_rlrollout.snapshot.layout import CONFIG
from pytest_rlrollout.snapshot.validate.core import WEIGHTS, Inconclusive, NotApplicable, Problem, Subject, check

IGNORED_CONFIG_KEYS = {"transformers_version", "_name_or_path", "quantization_config"}


@check("SNAP-CONFIG-1", WEIGHTS)
def _config_loads(s: Subject) -> Iterator[Problem]:
    value, error = s.config
    if error:
        yield Problem(CONFIG, error)
        return
    if not isinstance(value, dict):
        yield Problem(CONFIG, f"is a JSON {type(value).__name__}, not an object")
        return
    model_type = value.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        yield Problem(CONFIG, "has no model_type, so it cannot load as a Hugging Face config")
        return
    if s.ctx.hf_config:
        complaint = _transformers_complaint(value)
        if complaint:
            yield Problem(CONFIG, complaint)


def _transformers_complaint(config: dict[str, Any]) -> str | None:
    known = transformers_model_types()
    if known is None:
        return None  # without transformers, a model_type is all that can be asked
    if config["model_type"] not in known:
        return f"model_type {untrusted.shown(config['model_type'])} is not known to the installed transformers"
    return None


@cache
def transformers_model_types() -> frozenset[str] | None:
    """The model types the installed transformers knows, read from its mapping source files
    without importing it (importing transformers' configs imports torch: seconds); None when
    transformers is not installed."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    auto = Path(next(iter(spec.submodule_search_locations))) / "models" / "auto"
    names: set[str] = set()
    for file in ("auto_mappings.py", "configuration_auto.py"):  # the former since transformers 5
        if (auto / file).is_file():
            names |= _mapping_keys(ast.parse((auto / file).read_text()))
    return frozenset(names) or None


def _mapping_keys(tree: ast.Module) -> set[str]:
    """The string keys given to CONFIG_MAPPING_NAMES: `= OrderedDict([(key, ...), ...])`,
    `.update({key: ...})`."""
    out: set[str] = set()
    for stmt in tree.body:
        if not _about_config_mapping(stmt):
            continue
        for node in ast.walk(stmt):
            if isinstance(node, ast.Dict):
                out |= {v for k in node.keys if (v := _str(k)) is not None}
            elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and (v := _str(node.elts[0])) is not None:
                out.add(v)
    return out


def _about_config_mapping(stmt: ast.stmt) -> bool:
    """`CONFIG_MAPPING_NAMES = ...` or `CONFIG_MAPPING_NAMES.<method>(...)`."""
    if isinstance(stmt, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == "CONFIG_MAPPING_NAMES" for t in stmt.targets)
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        return isinstance(func, ast.Attribute) and getattr(func.value, "id", None) == "CONFIG_MAPPING_NAMES"
    return False


def _str(node: ast.AST | None) -> str | None:
    """The string a node is, when it is a string constant."""
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def config_differences(snapshot: Mapping[str, Any], base: Mapping[str, Any], ignore: Iterable[str] = ()) -> list[str]:
    """SNAP-CONFIG-2 in the documented wording; empty when the configs are equivalent."""
    ignored = IGNORED_CONFIG_KEYS | set(ignore)

    def canon(cfg: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in cfg.items() if k not in ignored}
        if "torch_dtype" in out and "dtype" not in out:
            out["dtype"] = out.pop("torch_dtype")
        out.pop("torch_dtype", None)
        return out

    a, b = canon(snapshot), canon(base)
    shown = untrusted.shown  # keys and values can be megabytes long: each is cut to size
    if "model_type" in a and "model_type" in b and a["model_type"] != b["model_type"]:
        return [
            f"Types mismatch: snapshot model_type {shown(a['model_type'])}, base model_type {shown(b['model_type'])}"
        ]
    problems = []
    extra_snapshot = sorted(set(a) - set(b))
    extra_base = sorted(set(b) - set(a))
    if extra_snapshot:
        problems.append(f"Extra snapshot model config options: {shown(extra_snapshot, 1000)}")
    if extra_base:
        problems.append(f"Extra base model config options: {shown(extra_base, 1000)}")
    for key in sorted(set(a) & set(b)):
        if a[key] != b[key]:
            where = untrusted.brief_text(key, 200)
            problems.append(f"Config value mismatch for {where}: snapshot {shown(a[key])}, base {shown(b[key])}")
    return problems


@check("SNAP-CONFIG-2", WEIGHTS)
def _config_matches_base(s: Subject) -> Iterator[Problem]:
    if s.base is None:
        raise NotApplicable("no base snapshot given")
    mine = s.config_dict()
    try:
        theirs = s.base.config_dict()
    except Inconclusive:
        raise Inconclusive("the base snapshot's config.json did not load") from None
    for message in config_differences(mine, theirs, _ignored_fields(s.ctx.signal)):
        yield Problem(CONFIG, message)


def _ignored_fields(signal: Mapping[str, Any] | None) -> list[str]:
    """The signal's validation.extra_fields_ignore, as far as it is a list of strings; whatever
    else it holds is HL-POST-2's or HL-CONFIG-2's finding, on the signal."""
    validation = (signal or {}).get("validation")
    ignore = validation.get("extra_fields_ignore") if isinstance(validation, dict) else None
    return [k for k in ignore if isinstance(k, str)] if isinstance(ignore, list) else []
