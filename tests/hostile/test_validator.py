"""The snapshot validator on hostile snapshots, signals and names: every input ends as a finding of
the clause it breaks (exit 1) or as one usage-error line (exit 2), never a traceback and never a
hang, in bounded time and memory; text output prints untrusted names escaped, one finding a line;
and the validator writes nothing anywhere.

Each generator below writes one hostile input into the test's tmp_path (from a copy of a valid
reference case) and returns the `rlrollout validate` arguments that judge it."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import re
import shutil
import socket
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import zstandard

from pytest_rlrollout.cli import main
from pytest_rlrollout.contract import catalogue
from pytest_rlrollout.snapshot import tiny_moe, untrusted
from pytest_rlrollout.snapshot.cases import ReferenceCases
from pytest_rlrollout.snapshot.layout import ADAPTER_CONFIG, CONFIG, INDEX, SPEC
from pytest_rlrollout.snapshot.validate import CHECKS

from .budget import Budget

SHARD = "model-00002-of-00005.safetensors"  # a layer shard of the full reference snapshot
ADAPTER = "adapter_model.safetensors"
MIB = 1 << 20
Make = Callable[[ReferenceCases, Path], list[str]]


# --------------------------------------------------------------------------- nothing is written

_writes: list[str] | None = None  # what the validator wrote while a run is watched; None: not watching
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_MUTATING = set(
    "os.remove os.rename os.mkdir os.rmdir os.symlink os.link os.truncate os.chmod os.chown os.utime "
    "shutil.rmtree shutil.move shutil.copyfile".split()
)


def _audit(event: str, args: tuple) -> None:
    # An audit hook sees every write Python makes (builtins.open, os.open, renames...), wherever the
    # validator's code path goes; Python's own bytecode cache is not the validator's doing.
    if _writes is None or "__pycache__" in repr(args):
        return
    if event == "open":
        _, mode, flags = args
        if (isinstance(flags, int) and flags & _WRITING) or (isinstance(mode, str) and set(mode) & set("wax+")):
            _writes.append(f"{event} {args!r}")
    elif event in _MUTATING:
        _writes.append(f"{event} {args!r}")


sys.addaudithook(_audit)  # hooks cannot be removed; outside a watched run it returns at once


@dataclass
class Run:
    code: int
    out: str
    err: str


def validate(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Run:
    """`rlrollout validate ARGV` in-process, watched for writes."""
    global _writes
    capsys.readouterr()
    _writes = []
    try:
        code = main(["validate", *argv])
    finally:
        writes, _writes = _writes, None
    out, err = capsys.readouterr()
    assert writes == [], writes
    assert "Traceback" not in err, err[-2000:]
    return Run(code, out, err)


_LINE = re.compile(
    r"  (?P<clause>[A-Z][A-Z0-9a-]*(?:-[A-Za-z0-9]+)+) \[(MUST|SHOULD|MAY)\] |  \(--format json|valid|INVALID|hint: "
)


def assert_safe_text(out: str) -> None:
    """Text output: printable lines only (no escape sequences, no carriage returns), and every line
    after the first a finding of a real clause, the summary or a hint: no injected lines."""
    lines = out.splitlines()
    assert lines, out
    clauses = {c.id for c in catalogue()}
    for line in lines:
        assert line.isprintable(), repr(line)
        assert len(line) < 4000, f"{len(line)} characters: {line[:200]!r}"
    for line in lines[1:]:
        m = _LINE.match(line)
        assert m, f"not a line of a report: {line[:300]!r}"
        assert m.group("clause") is None or m.group("clause") in clauses, line[:300]


def one_error_line(err: str, prefix: str = "rlrollout validate: error: ") -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith(prefix) and lines[0].isprintable() and len(lines[0]) < 2000, lines[0][:500]
    return lines[0]


@pytest.fixture(scope="module", autouse=True)
def warm(reference: ReferenceCases) -> None:
    """Import and compile everything the validator uses once, before any budget measures."""
    with contextlib.redirect_stdout(io.StringIO()):
        for kind in ("full", "incremental", "lora", "quantized"):
            main(["validate", str(reference[kind].snapshot), "--base", str(reference.base)])


# --------------------------------------------------------------------------- building hostile inputs


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def replace_file(path: Path, content: bytes | None = None) -> Path:
    """Remove whatever is at `path` (file, link, FIFO, directory) and write `content` if given."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if content is not None:
        path.write_bytes(content)
    return path


def safetensors(header: bytes, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A safetensors file's bytes: the little-endian header length (or a lie), the header, the data."""
    return (len(header) if length is None else length).to_bytes(8, "little") + header + data


def one_tensor(entry: object, data: bytes = b"x", name: str = "model.layers.1.w") -> bytes:
    return safetensors(json.dumps({name: entry}).encode(), data)


def deep(n: int, inner: bytes = b"") -> bytes:
    return b"[" * n + inner + b"]" * n


def full(ref: ReferenceCases, tmp: Path) -> tuple[Path, list[str]]:
    snap = copy(ref["full"].snapshot, tmp / "snap")
    return snap, [str(snap), "--base", str(ref.base)]


def lora(ref: ReferenceCases, tmp: Path) -> tuple[Path, list[str]]:
    snap = copy(ref["lora"].snapshot, tmp / "lora")
    return snap, [str(snap), "--base", str(ref.base), "--base-model", tiny_moe.MODEL_NAME]


def diff(ref: ReferenceCases, tmp: Path, *, parent: Path | None = None, **signal: object) -> tuple[Path, list[str]]:
    """The reference ARC2 diff (of the base), with its signal file (fields replaced by `signal`)."""
    inc = ref["incremental"]
    snap = copy(inc.snapshot, tmp / "diff")
    body = {**(inc.signal or {}), **signal}
    (tmp / "signal.json").write_text(json.dumps(body))
    args = ["--parent", str(parent or ref.base), "--signal", str(tmp / "signal.json")]
    return snap, [str(snap), *args, "--base", str(ref.base)]


def own_parent(ref: ReferenceCases, tmp: Path) -> Path:
    """A copy of the diff's parent (the base) to spoil; the directory keeps the base's name."""
    return copy(ref.base, tmp / "parent" / tiny_moe.BASE_IDENTITY)


def shard(content: Callable[[], bytes], name: str = SHARD) -> Make:
    def make(ref: ReferenceCases, tmp: Path) -> list[str]:
        snap, args = full(ref, tmp)
        replace_file(snap / name, content())
        return args

    return make


def in_full(name: str, content: Callable[[], bytes]) -> Make:
    return shard(content, name)


def in_lora(name: str, content: Callable[[], bytes]) -> Make:
    def make(ref: ReferenceCases, tmp: Path) -> list[str]:
        snap, args = lora(ref, tmp)
        replace_file(snap / name, content())
        return args

    return make


def edited_json(name: str, edit: Callable[[dict], object], *, kind: str = "full") -> Make:
    """The reference `kind` case with `edit` applied to the JSON document `name` (in place)."""

    def make(ref: ReferenceCases, tmp: Path) -> list[str]:
        snap, args = lora(ref, tmp) if kind == "lora" else full(ref, tmp)
        doc = json.loads((snap / name).read_text())
        edit(doc)
        (snap / name).write_text(json.dumps(doc))
        return args

    return make


def special(name: str, how: str, *, kind: str = "full") -> Make:
    """`name` in the `kind` case replaced by a FIFO, a socket, a directory or a symlink."""

    def make(ref: ReferenceCases, tmp: Path) -> list[str]:
        snap, args = {"full": full, "lora": lora, "diff": diff}[kind](ref, tmp)
        make_special(snap / name, how, tmp)
        return args

    return make


def make_special(path: Path, how: str, tmp: Path) -> None:
    replace_file(path)
    if how == "fifo":
        os.mkfifo(path)
    elif how == "socket":
        # AF_UNIX paths are limited to ~108 bytes: bind by a relative name from inside the directory
        here = os.getcwd()
        os.chdir(path.parent)
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.bind(path.name)
        finally:
            os.chdir(here)
    elif how == "directory":
        path.mkdir()
    elif how == "loop":
        path.symlink_to(path.name)
    elif how == "loop2":
        path.symlink_to(f"{path.name}.other")
        (path.parent / f"{path.name}.other").symlink_to(path.name)
    elif how == "dangling":
        path.symlink_to("not-there")
    elif how == "to-self-dir":
        path.symlink_to(".")
    elif how == "dev-zero":
        path.symlink_to("/dev/zero")
    elif how == "outside":
        outside = tmp / f"outside-{path.name}"
        outside.write_bytes(b"{}")
        path.symlink_to(outside)
    elif how == "sparse":
        with open(path, "wb") as f:
            f.truncate(3 << 30)  # 3 GiB, nearly all hole
    else:
        raise ValueError(how)


def signal_file(content: Callable[[], bytes] | None = None, *, how: str | None = None) -> Make:
    """The full case judged with a --signal file holding `content` (or being a FIFO, a loop...)."""

    def make(ref: ReferenceCases, tmp: Path) -> list[str]:
        _, args = full(ref, tmp)
        path = tmp / "hostile-signal.json"
        if how:
            make_special(path, how, tmp)
        else:
            path.write_bytes(content())
        return [*args, "--signal", str(path)]

    return make


def signal(**fields: object) -> Make:
    """The full case with a signal naming it, with `fields` added or replaced."""
    return signal_file(lambda: json.dumps({"identity": "snap", **fields}).encode())


def diff_signal(**fields: object) -> Make:
    def make(ref: ReferenceCases, tmp: Path) -> list[str]:
        meta = {**(ref["incremental"].signal or {})["incremental_snapshot_metadata"], **fields}
        return diff(ref, tmp, incremental_snapshot_metadata=meta)[1]

    return make


def diff_shard(content: Callable[[bytes], bytes], *, in_parent: bool = False) -> Make:
    """The ARC2 diff with SHARD's bytes (of the diff, or of a copy of its parent) rewritten."""

    def make(ref: ReferenceCases, tmp: Path) -> list[str]:
        parent = own_parent(ref, tmp) if in_parent else None
        snap, args = diff(ref, tmp, parent=parent)
        target = (parent if parent else snap) / SHARD
        target.write_bytes(content(target.read_bytes()))
        return args

    return make


def payload(
    frame: bytes, *, dtype: str = "U8", shape: list[int] | None = None, checksum: str | None = None
) -> Callable[[bytes], bytes]:
    """A diff file whose every tensor carries `frame` as its payload."""

    def rewrite(old: bytes) -> bytes:
        n = int.from_bytes(old[:8], "little")
        doc = json.loads(old[8 : 8 + n])
        meta, offset, header = doc.pop("__metadata__"), 0, {}
        for name in doc:
            offsets = [offset, offset + len(frame)]
            header[name] = {"dtype": dtype, "shape": shape or [len(frame)], "data_offsets": offsets}
            offset += len(frame)
            if checksum is not None:
                meta[name] = checksum
        raw = json.dumps({"__metadata__": meta, **header}).encode()
        return safetensors(raw, frame * len(header))

    return rewrite


def zstd_frame_with_window_log(log: int) -> bytes:
    """A zstd frame header asking for a 2**log-byte window (no content size, not single-segment)."""
    window_descriptor = bytes([(log - 10) << 3])
    return b"\x28\xb5\x2f\xfd" + b"\x00" + window_descriptor + b"\x01\x00\x00"  # + an empty last raw block


# --------------------------------------------------------------------------- the corpus


@dataclass(frozen=True)
class Hostile:
    make: Make
    clause: str | None  # the clause whose finding it must yield; None: a usage error (exit 2)
    words: str  # what that finding's message (or the error line) says
    seconds: float = 3.0
    rss_mb: float = 60.0
    text: str | None = None  # what the text report shows of it (escaped), when that is the point


def header(raw: Callable[[], bytes], words: str, **budget: float) -> Hostile:
    return Hostile(shard(raw), "SNAP-SAFETENSORS-1", words, **budget)


def entry(**fields: object) -> dict:
    return {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], **fields}


def many_tensors(n: int, value: bytes = b"{}") -> bytes:
    return b"{" + b",".join(b'"t%d":%s' % (i, value) for i in range(n)) + b"}"


def _sparse_header(ref: ReferenceCases, tmp: Path) -> list[str]:
    """A shard whose header length says 40 MiB, in a file that long (nearly all hole)."""
    snap, args = full(ref, tmp)
    with open(snap / SHARD, "wb") as f:
        f.write(safetensors(b"{", length=40 * MIB))
        f.truncate(8 + 40 * MIB)
    return args


HEADERS = {
    "header nested 990 deep": header(lambda: safetensors(b'{"a":' + deep(990) + b"}"), "nested deeper than 64"),
    "header nested 1M deep": header(lambda: safetensors(deep(1_000_000)), "nested deeper than 64"),
    "header dtype an object": header(lambda: one_tensor(entry(dtype={"x": 1})), "unknown dtype"),
    "header dtype a list": header(lambda: one_tensor(entry(dtype=["U8"])), "unknown dtype"),
    "header shape an object": header(lambda: one_tensor(entry(shape={"a": 1})), "shape {'a': 1} is not a list"),
    "header shape of floats": header(lambda: one_tensor(entry(shape=[1.0])), "is not a list"),
    "header shape of booleans": header(lambda: one_tensor(entry(shape=[True])), "is not a list"),
    "header shape of rank 100": header(lambda: one_tensor(entry(shape=[1] * 100)), "at most 64"),
    "header dimension 2**64": header(lambda: one_tensor(entry(shape=[2**64])), "unsigned 64-bit"),
    "header dimensions whose product overflows": header(
        lambda: one_tensor(entry(shape=[2**63, 2**63, 2**63])), "holds 1 bytes"
    ),
    "header negative offsets": header(lambda: one_tensor(entry(data_offsets=[-1, 0])), "data_offsets"),
    "header offsets as strings": header(lambda: one_tensor(entry(data_offsets=["0", "1"])), "data_offsets"),
    "header three offsets": header(lambda: one_tensor(entry(data_offsets=[0, 1, 2])), "data_offsets"),
    "header offsets ending before they begin": header(lambda: one_tensor(entry(data_offsets=[1, 0])), "before"),
    "header offsets 2**70": header(lambda: one_tensor(entry(data_offsets=[0, 2**70])), "data_offsets"),
    "header entry not an object": header(lambda: one_tensor([1, 2]), "entry is not an object"),
    "header a JSON array": header(lambda: safetensors(b"[1, 2]"), "not an object"),
    "header a JSON string": header(lambda: safetensors(b'"x"'), "not an object"),
    "header of zero bytes": header(lambda: safetensors(b""), "not valid JSON"),
    "header of spaces": header(lambda: safetensors(b" " * 64), "not valid JSON"),
    "header not UTF-8": header(lambda: safetensors(b'{"\xff\xfe": 1}'), "not UTF-8"),
    "header with a BOM": header(lambda: safetensors(b"\xef\xbb\xbf{}"), "not valid JSON"),
    "header with NaN": header(lambda: one_tensor(entry(shape=[math.nan])), "NaN is not a JSON number"),
    "header with Infinity": header(lambda: safetensors(b'{"w": {"shape": [Infinity]}}'), "Infinity"),
    "header with 1e400": header(lambda: safetensors(b'{"w": {"shape": [1e400]}}'), "out of range"),
    "header with a 5000-digit integer": header(lambda: safetensors(b'{"w": [' + b"9" * 5000 + b"]}"), "not valid JSON"),
    "header with a duplicate tensor": header(
        lambda: safetensors(
            b'{"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
            b'"w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}',
            b"xx",
        ),
        "leaves a gap",
    ),
    "header with overlapping tensors": header(
        lambda: safetensors(json.dumps({"a": entry(), "b": entry()}).encode(), b"x"), "overlaps"
    ),
    "header metadata a list": header(lambda: safetensors(b'{"__metadata__": [1]}'), "__metadata__"),
    "header metadata of numbers": header(lambda: safetensors(b'{"__metadata__": {"a": 1}}'), "__metadata__"),
    "header tensor name of 100k characters": header(lambda: one_tensor(entry(), name="x" * 100_000), "(100000 char"),
    "header length beyond the file": header(lambda: safetensors(b"{}", length=10**6), "exceeds the file"),
    "header length 2**64-1": header(lambda: safetensors(b"{}", length=2**64 - 1), "exceeds the file"),
    "header length 40 MiB in a sparse file": Hostile(_sparse_header, "SNAP-SAFETENSORS-1", "33554432-byte limit"),
    "file of 3 bytes": header(lambda: b"abc", "shorter than the 8-byte header length"),
    "empty file": header(lambda: b"", "shorter than the 8-byte header length"),
    "a million tensors (56 MB header)": header(
        lambda: safetensors(many_tensors(1_000_000, b'{"dtype":"U8","shape":[0],"data_offsets":[0,0]}')),
        "33554432-byte limit",
    ),
    "a million empty tensor entries (8 MB header)": header(
        lambda: safetensors(many_tensors(1_000_000)), "more than 65536 tensors", rss_mb=80
    ),
    "a million scalar tensor entries (10 MB header)": header(
        lambda: safetensors(many_tensors(1_000_000, b"0")),
        "more than 65536 tensors",
    ),
    "three million JSON items": header(
        lambda: safetensors(b'{"a":[' + b"0," * 3_000_000 + b"0]}"),
        "more than 2097152 JSON items",
    ),
    "a 1 MB metadata string": header(
        lambda: safetensors(json.dumps({"__metadata__": {"a": "x" * MIB}, "w": entry(dtype=["y" * MIB])}).encode()),
        "unknown dtype",
    ),
}


def json_cases(name: str, clause: str, kind: str = "full") -> dict[str, Hostile]:
    put = in_lora if kind == "lora" else in_full
    return {
        f"{name} nested 990 deep": Hostile(put(name, lambda: b'{"a":' + deep(990) + b"}"), clause, "nested deeper"),
        f"{name} nested 1M deep": Hostile(put(name, lambda: deep(1_000_000, b"{")), clause, "nested deeper"),
        f"{name} of 3M items": Hostile(put(name, lambda: b"[" + b"0," * 3_000_000 + b"0]"), clause, "JSON items"),
        f"{name} not UTF-8": Hostile(put(name, lambda: b'{"a": "\xff"}'), clause, "not UTF-8"),
        f"{name} with a BOM": Hostile(put(name, lambda: b'\xef\xbb\xbf{"a": 1}'), clause, "not valid JSON"),
        f"{name} empty": Hostile(put(name, lambda: b""), clause, "not valid JSON"),
        f"{name} a number": Hostile(
            put(name, lambda: b"5"), clause, "not of type 'object'" if name != CONFIG else "is a JSON int"
        ),
        f"{name} a FIFO": Hostile(special(name, "fifo", kind=kind), clause, "is a FIFO"),
        f"{name} a socket": Hostile(special(name, "socket", kind=kind), clause, "is a socket"),
        f"{name} a directory": Hostile(special(name, "directory", kind=kind), clause, "is a directory")
        if kind != "lora"
        else Hostile(special(name, "directory", kind=kind), "SNAP-LORA-1", "but no adapter_config.json"),
        f"{name} a symlink loop": Hostile(special(name, "loop", kind=kind), clause, "symlink loop"),
        f"{name} a two-link symlink loop": Hostile(special(name, "loop2", kind=kind), clause, "symlink loop"),
        f"{name} a dangling symlink": Hostile(special(name, "dangling", kind=kind), clause, "dangling symlink"),
        f"{name} a symlink to the snapshot": Hostile(special(name, "to-self-dir", kind=kind), clause, "is a directory"),
        f"{name} a symlink to /dev/zero": Hostile(special(name, "dev-zero", kind=kind), clause, "leaving the snapshot"),
        f"{name} a symlink out": Hostile(special(name, "outside", kind=kind), clause, "leaving the snapshot"),
        f"{name} a sparse 3 GiB file": Hostile(
            special(name, "sparse", kind=kind), clause, "more than the validator reads"
        ),
    }


def _big_weight_map(doc: dict) -> None:
    doc["weight_map"] = {f"t{i}": i for i in range(300_000)}


def _many_files(doc: dict) -> None:
    # the bound proven is MAX_FINDINGS (1000 listed per clause); 5000 missing files is five times
    # past it, and past MAX_FILES (4096) too: 300k took 5 s of CPU to prove the same cut
    doc["weight_map"] = {f"t{i}": f"f{i}.safetensors" for i in range(5000)}


def _spec_rank(doc: dict) -> None:
    first = next(iter(doc["tensor_map"]))
    doc["tensor_map"][first]["shape"] = [1] * 100_000


def _targets(doc: dict) -> None:
    doc["target_modules"] = [f"m{i}" for i in range(500_000)]


def _rank0_adapter(ref: ReferenceCases, tmp: Path) -> list[str]:
    snap, args = lora(ref, tmp)
    (snap / ADAPTER).write_bytes(_scalar_adapter_tensor())
    doc = json.loads((snap / ADAPTER_CONFIG).read_text())
    doc["r"] = "four"
    (snap / ADAPTER_CONFIG).write_text(json.dumps(doc))
    return args


def _scalar_adapter_tensor() -> bytes:
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    return safetensors(json.dumps({name: {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}).encode(), b"\0" * 4)


EVIL = "evil\nSNAP-FAKE [MUST] injected\x1b[31m"
DOCUMENTS = {
    **json_cases(CONFIG, "SNAP-CONFIG-1"),
    **json_cases(INDEX, "SNAP-INDEX-1"),
    **json_cases(SPEC, "SNAP-SPEC-1"),
    **json_cases(ADAPTER_CONFIG, "SNAP-LORA-3", kind="lora"),
    "index weight_map a list": Hostile(
        edited_json(INDEX, lambda d: d.update(weight_map=[1, 2])), "SNAP-INDEX-1", "is not of type 'object'"
    ),
    "index weight_map of numbers": Hostile(
        edited_json(INDEX, lambda d: d["weight_map"].update(dict.fromkeys(d["weight_map"], 7))),
        "SNAP-INDEX-1",
        "is not of type 'string'",
    ),
    "index weight_map of 300k wrong entries": Hostile(
        edited_json(INDEX, _big_weight_map), "SNAP-INDEX-1", "at most", seconds=5, rss_mb=100
    ),
    "index names 5000 missing files": Hostile(
        edited_json(INDEX, _many_files), "SNAP-INDEX-1", "the validator lists at most 1000", seconds=10, rss_mb=150
    ),
    "index names a file of 100k characters": Hostile(
        edited_json(INDEX, lambda d: d["weight_map"].update({"model.norm.weight": "x" * 100_000 + ".safetensors"})),
        "SNAP-INDEX-1",
        "longer than any file name",
    ),
    "index names files of lone surrogates": Hostile(
        in_full(
            INDEX, lambda: b'{"weight_map": {"a": "\\ud800.safetensors", "b": "' + b"\\udfff" * 300 + b'.safetensors"}}'
        ),
        "SNAP-INDEX-1",
        "longer than any file name",
        text="\\udfff",
    ),
    "index names a file with a newline and escapes": Hostile(
        edited_json(INDEX, lambda d: d["weight_map"].update({"model.norm.weight": EVIL + ".safetensors"})),
        "SNAP-INDEX-1",
        "evil",
    ),
    "index with NaN values": Hostile(in_full(INDEX, lambda: b'{"weight_map": {"a": NaN}}'), "SNAP-INDEX-1", "nan"),
    "index with a duplicate weight_map": Hostile(
        in_full(INDEX, lambda: b'{"weight_map": {"a": "b.safetensors"}, "weight_map": []}'),
        "SNAP-INDEX-1",
        "is not of type 'object'",
    ),
    "spec tensor_map a list": Hostile(
        edited_json(SPEC, lambda d: d.update(tensor_map=[])), "SNAP-SPEC-1", "is not of type 'object'"
    ),
    "spec shape of rank 100k": Hostile(edited_json(SPEC, _spec_rank), "SNAP-SPEC-2", "spec says shape [1, 1"),
    "spec dtype an object": Hostile(
        edited_json(SPEC, lambda d: next(iter(d["tensor_map"].values())).update(dtype={"a": []})),
        "SNAP-SPEC-1",
        "is not of type 'string'",
    ),
    "config model_type an object": Hostile(
        edited_json(CONFIG, lambda d: d.update(model_type={"a": 1})), "SNAP-CONFIG-1", "no model_type"
    ),
    "config with NaN and Infinity": Hostile(
        in_full(CONFIG, lambda: b'{"model_type": "qwen3_moe", "hidden_size": NaN, "x": -Infinity}'),
        "SNAP-CONFIG-2",
        "hidden_size",
    ),
    "config with a key of 1M characters": Hostile(
        edited_json(CONFIG, lambda d: d.update({"k" * MIB: 1})), "SNAP-CONFIG-2", "characters"
    ),
    "config with a value of 1M characters": Hostile(
        edited_json(CONFIG, lambda d: d.update(hidden_size="v" * MIB)), "SNAP-CONFIG-2", "characters"
    ),
    "config with a 40 MB string": Hostile(
        in_full(CONFIG, lambda: b'{"a": "' + b"x" * (40 * MIB) + b'"}'),
        "SNAP-CONFIG-1",
        "more than the validator reads",
    ),
    "adapter_config of wrong types": Hostile(
        edited_json(
            ADAPTER_CONFIG, lambda d: d.update(r="abc", target_modules=5, base_model_name_or_path=[]), kind="lora"
        ),
        "SNAP-LORA-3",
        "is not of type",
    ),
    "adapter_config target_modules of lists": Hostile(
        edited_json(ADAPTER_CONFIG, lambda d: d.update(target_modules=[["q_proj"], {"a": 1}, "wq"]), kind="lora"),
        "SNAP-LORA-3",
        "is not valid under any of the given schemas",
    ),
    "adapter_config r a boolean": Hostile(
        edited_json(ADAPTER_CONFIG, lambda d: d.update(r=True), kind="lora"), "SNAP-LORA-3", "rank True"
    ),
    "adapter_config r of 2**70": Hostile(
        edited_json(ADAPTER_CONFIG, lambda d: d.update(r=2**70), kind="lora"), "SNAP-LORA-3", "needs"
    ),
    "adapter_config of 500k target modules": Hostile(
        edited_json(ADAPTER_CONFIG, _targets, kind="lora"), "SNAP-LORA-3", "match no module", seconds=5, rss_mb=150
    ),
    "adapter tensor of rank 0": Hostile(_rank0_adapter, "SNAP-LORA-3", "shape []"),
}


def _quant(block: object) -> Make:
    def make(ref: ReferenceCases, tmp: Path) -> list[str]:
        snap = copy(ref["quantized"].snapshot, tmp / "fp8")
        doc = json.loads((snap / CONFIG).read_text())
        doc["quantization_config"]["weight_block_size"] = block
        (snap / CONFIG).write_text(json.dumps(doc))
        return [str(snap), "--base", str(ref.base)]

    return make


DOCUMENTS["quantization block of 2**70"] = Hostile(_quant([2**70, 1]), "SNAP-QUANT-1", "needs")
DOCUMENTS["quantization block of NaN"] = Hostile(_quant([math.nan, {}]), "SNAP-QUANT-1", "not a pair of positive")


def _stray_shards(ref: ReferenceCases, tmp: Path) -> list[str]:
    # one file past MAX_FILES (4096) with the snapshot's own shards: every file past the bound is
    # a file the validator must leave unread; 5000 proved the same bound at 1.2 times the cost
    snap, args = full(ref, tmp)
    for i in range(4097):
        (snap / f"stray-{i}.safetensors").write_bytes(b"")
    return args


def _tensor_flood(ref: ReferenceCases, tmp: Path) -> list[str]:
    """Five shards of 65,536 (empty) tensors each: every header within its own bounds, the
    snapshot beyond the bound on tensors read."""
    snap, args = full(ref, tmp)
    raw = safetensors(many_tensors(65_536, b'{"dtype":"U8","shape":[0],"data_offsets":[0,0]}'))
    for i in range(5):
        (snap / f"flood-{i}.safetensors").write_bytes(raw)
    return args


FILES = {
    **{
        f"shard {how}": Hostile(special(SHARD, how), clause, words)
        for how, clause, words in [
            ("fifo", "SNAP-SAFETENSORS-1", "is a FIFO"),
            ("socket", "SNAP-SAFETENSORS-1", "is a socket"),
            ("directory", "SNAP-INDEX-1", "is a directory"),
            ("loop", "SNAP-SAFETENSORS-1", "symlink loop"),
            ("loop2", "SNAP-SAFETENSORS-1", "symlink loop"),
            ("dangling", "SNAP-SAFETENSORS-1", "dangling symlink"),
            ("to-self-dir", "SNAP-SAFETENSORS-1", "is a directory"),
            ("dev-zero", "SNAP-SAFETENSORS-1", "leaving the snapshot"),
            ("outside", "SNAP-SAFETENSORS-1", "leaving the snapshot"),
            ("sparse", "SNAP-SAFETENSORS-1", "not valid JSON"),
        ]
    },
    **{
        f"tokenizer.json {how}": Hostile(special("tokenizer.json", how), "SNAP-TOK-1", words)
        for how, words in [
            ("fifo", "is a FIFO"),
            ("loop", "symlink loop"),
            ("dangling", "dangling symlink"),
            ("dev-zero", "leaving the snapshot"),
            ("directory", "is a directory"),
        ]
    },
    "tokenizer.json a sparse 3 GiB file": Hostile(special("tokenizer.json", "sparse"), "SNAP-TOK-1a", "differs"),
    "a tiktoken FIFO": Hostile(special("x.tiktoken", "fifo"), "SNAP-TOK-1", "is a FIFO"),
    "adapter weights a symlink loop": Hostile(
        special(ADAPTER, "loop", kind="lora"), "SNAP-SAFETENSORS-1", "symlink loop"
    ),
    "adapter weights a FIFO": Hostile(special(ADAPTER, "fifo", kind="lora"), "SNAP-SAFETENSORS-1", "is a FIFO"),
    "diff shard a symlink loop": Hostile(special(SHARD, "loop", kind="diff"), "SNAP-SAFETENSORS-1", "symlink loop"),
    "diff shard a FIFO": Hostile(special(SHARD, "fifo", kind="diff"), "SNAP-SAFETENSORS-1", "is a FIFO"),
    "five shards of 65536 tensors": Hostile(
        _tensor_flood, "SNAP-SAFETENSORS-1", "more than 262144 tensors", seconds=25, rss_mb=500
    ),
    "4097 stray shards": Hostile(_stray_shards, "SNAP-SAFETENSORS-1", "more than 4096", seconds=5),
}


def checksums(value: str) -> Callable[[bytes], bytes]:
    """A diff file with its payloads kept and every checksum in `__metadata__` replaced by `value`."""

    def rewrite(old: bytes) -> bytes:
        n = int.from_bytes(old[:8], "little")
        doc = json.loads(old[8 : 8 + n])
        doc["__metadata__"] = dict.fromkeys(doc["__metadata__"], value)
        return safetensors(json.dumps(doc).encode(), old[8 + n :])

    return rewrite


def _fifo_parent_shard(ref: ReferenceCases, tmp: Path) -> list[str]:
    parent = own_parent(ref, tmp)
    make_special(parent / SHARD, "fifo", tmp)
    return diff(ref, tmp, parent=parent)[1]


DIFFS = {
    "diff header nested 990 deep": Hostile(
        diff_shard(lambda _: safetensors(b'{"a":' + deep(990) + b"}")), "SNAP-SAFETENSORS-1", "nested deeper"
    ),
    "parent header nested 990 deep": Hostile(
        diff_shard(lambda _: safetensors(deep(990)), in_parent=True), "SNAP-INC-3", "parent"
    ),
    "parent shard a FIFO": Hostile(_fifo_parent_shard, "SNAP-INC-3", "is a FIFO"),
    "payload not a zstd frame": Hostile(diff_shard(payload(b"junk")), "SNAP-INC-3", "not a zstd frame"),
    "payload an arc_v3 envelope": Hostile(
        diff_shard(payload(b"ARC3_ENVELOPE\x00pickle")), "SNAP-INC-3", "never decoded"
    ),
    "payload declaring 2**60 bytes": Hostile(
        diff_shard(payload(b"\x28\xb5\x2f\xfd\xa4" + (2**60).to_bytes(8, "little") + b"\x01\x00\x00")),
        "SNAP-INC-3",
        "declares",
    ),
    "payload a zstd bomb of 64 MiB": Hostile(
        diff_shard(payload(zstandard.ZstdCompressor(level=19, write_content_size=False).compress(bytes(64 * MIB)))),
        "SNAP-INC-3",
        "longer than the parent tensor",
    ),
    "payload asking for a 2 GiB window": Hostile(
        diff_shard(payload(zstd_frame_with_window_log(31))), "SNAP-INC-3", "does not decompress"
    ),
    "payload of F32": Hostile(diff_shard(payload(b"\0\0\0\0", dtype="F32", shape=[1])), "SNAP-INC-3", "not a 1-D U8"),
    "payload checksums of 100k digits": Hostile(
        diff_shard(checksums("9" * 100_000)), "SNAP-INC-3", "__metadata__ says"
    ),
    "payload checksums in Arabic digits": Hostile(diff_shard(checksums("١٢٣")), "SNAP-INC-3", "says ١٢٣"),
    "payload checksums missing": Hostile(diff_shard(checksums("")), "SNAP-INC-3", "no decimal Adler-32"),
    "payload a zlib stream": Hostile(diff_shard(payload(zlib.compress(b"x" * 100))), "SNAP-INC-3", "not a zstd frame"),
}


SIGNALS = {
    "signal a FIFO": Hostile(signal_file(how="fifo"), None, "is a FIFO"),
    "signal a socket": Hostile(signal_file(how="socket"), None, "is a socket"),
    "signal a directory": Hostile(signal_file(how="directory"), None, "is a directory"),
    "signal a symlink loop": Hostile(signal_file(how="loop"), None, "hostile-signal.json"),
    "signal /dev/zero": Hostile(signal_file(how="dev-zero"), None, "is a character device"),
    "signal a sparse 3 GiB file": Hostile(signal_file(how="sparse"), None, "more than the validator reads"),
    "signal nested 990 deep": Hostile(
        signal_file(lambda: b'{"identity": "snap", "validation":' + deep(990) + b"}"), None, "nested deeper"
    ),
    "signal nested 500k deep": Hostile(signal_file(lambda: deep(500_000)), None, "nested deeper"),
    "signal not UTF-8": Hostile(signal_file(lambda: b'{"identity": "\xff"}'), None, "not UTF-8"),
    "signal a list": Hostile(signal_file(lambda: b"[1]"), None, "JSON object"),
    "signal empty": Hostile(signal_file(lambda: b""), None, "not valid JSON"),
    "signal validation a string": Hostile(signal(validation="abc"), "HL-POST-2", "'abc' is not of type 'object'"),
    "signal extra_fields_ignore a number": Hostile(
        signal(validation={"extra_fields_ignore": 5}), "HL-CONFIG-2", "is not of type 'array'"
    ),
    "signal extra_fields_ignore of junk": Hostile(
        signal(validation={"extra_fields_ignore": [1, {}, None]}), "HL-CONFIG-2", "is not of type 'string'"
    ),
    "signal identity 123": Hostile(signal(identity=123), "SNAP-ID-1", "not a string"),
    "signal identity null": Hostile(signal(identity=None), "SNAP-ID-1", "not a string"),
    "signal identity a list": Hostile(signal(identity=["a"]), "SNAP-ID-1", "not a string"),
    "signal identity NaN": Hostile(signal_file(lambda: b'{"identity": NaN}'), "SNAP-ID-1", "not a string"),
    "signal identity an object": Hostile(signal(identity={"a": {"b": []}}), "SNAP-ID-1", "not a string"),
    "signal identity with escapes": Hostile(signal(identity=EVIL), "SNAP-ID-1", "control character"),
    "signal identity of 100k characters": Hostile(signal(identity="i" * 100_000), "SNAP-ID-1", "100000 bytes long"),
    "signal without identity": Hostile(
        signal_file(lambda: b'{"reset_prompt_cache": true}'), "HL-POST-2", "'identity' is a required property"
    ),
    "signal with 50k unknown fields": Hostile(
        signal_file(lambda: json.dumps({"identity": "snap", **{f"f{i}": 0 for i in range(50_000)}}).encode()),
        "HL-POST-2",
        "Extra inputs are not permitted",
    ),
    "signal of 2 MiB": Hostile(
        signal_file(lambda: json.dumps({"identity": "snap", "f": "x" * (2 * MIB)}).encode()),
        None,
        "more than the validator reads",
    ),
    "signal reset_prompt_cache NaN": Hostile(
        signal_file(lambda: b'{"identity": "snap", "reset_prompt_cache": NaN}'), "HL-POST-3", "nan"
    ),
    "signal incremental metadata a list": Hostile(
        lambda ref, tmp: diff(ref, tmp, incremental_snapshot_metadata=[1])[1],
        "SNAP-INC-4",
        "no incremental_snapshot_metadata",
    ),
    "signal compression_format nested": Hostile(
        diff_signal(compression_format={"a": [[[[{}]]]] * 50_000}), "SNAP-INC-4", "not 'arc_v2'"
    ),
    "signal compression_format arc_v3": Hostile(diff_signal(compression_format="arc_v3"), "SNAP-INC-3", "pickles"),
    "signal checksum_format a list": Hostile(diff_signal(checksum_format=["alder32"]), "SNAP-INC-4", "not 'alder32'"),
    "signal previous identity a number": Hostile(
        diff_signal(previous_snapshot_identity=7), "SNAP-INC-5", "previous_snapshot_identity is 7"
    ),
}


def _evil_names(name: str, *, fs_name: bytes | None = None) -> Make:
    """A stray (unreferenced) shard named `name` (or the raw bytes `fs_name`) beside the files."""

    def make(ref: ReferenceCases, tmp: Path) -> list[str]:
        snap, args = full(ref, tmp)
        target = os.path.join(os.fsencode(snap), fs_name) if fs_name else snap / name
        with open(target, "wb") as f:
            f.write((snap / SHARD).read_bytes())
        return args

    return make


def _evil_directory(ref: ReferenceCases, tmp: Path) -> list[str]:
    snap = copy(ref["full"].snapshot, tmp / "snap\nSNAP-FAKE [MUST] x\x1b]0;title\x07")
    (snap / "stray.safetensors").write_bytes((snap / SHARD).read_bytes())
    return [str(snap), "--base", str(ref.base)]


def _evil_tensor(ref: ReferenceCases, tmp: Path) -> list[str]:
    snap, args = full(ref, tmp)
    name = f"model.{EVIL}.weight\u202e"
    (snap / "extra.safetensors").write_bytes(one_tensor(entry(), name=name))
    index = json.loads((snap / INDEX).read_text())
    index["weight_map"][name] = "extra.safetensors"
    (snap / INDEX).write_text(json.dumps(index))
    return args


NAMES = {
    "shard named with a newline and escapes": Hostile(
        _evil_names(EVIL + ".safetensors"), "SNAP-INDEX-3a", EVIL, text="evil\\nSNAP-FAKE [MUST] injected\\x1b[31m"
    ),
    "shard named with bidi overrides": Hostile(
        _evil_names("\u202egnp.safetensors"), "SNAP-INDEX-3a", "\u202e", text="\\u202egnp.safetensors"
    ),
    "shard named with C1 controls": Hostile(
        _evil_names("a\x9b31m\r.safetensors"), "SNAP-INDEX-3a", "\x9b", text="a\\x9b31m\\r.safetensors"
    ),
    "shard named in invalid UTF-8": Hostile(
        _evil_names("", fs_name=b"bad\xff\xfe.safetensors"),
        "SNAP-INDEX-3a",
        "\udcff",
        text="bad\\udcff\\udcfe.safetensors",
    ),
    "snapshot directory named with escapes": Hostile(
        _evil_directory, "SNAP-INDEX-3a", "stray", text="snap\\nSNAP-FAKE [MUST] x\\x1b]0;title\\x07"
    ),
    "tensor named with escapes": Hostile(
        _evil_tensor, "SNAP-COVER-1", "injected", text="injected\\x1b[31m.weight\\u202e"
    ),
    "identity with escapes": Hostile(
        lambda ref, tmp: [*full(ref, tmp)[1], "--identity", EVIL], "SNAP-ID-1", "control character"
    ),
}

USAGE = {
    "snapshot missing": Hostile(lambda ref, tmp: [str(tmp / "nope")], None, "not a directory"),
    "snapshot a FIFO": Hostile(
        lambda ref, tmp: make_special(tmp / "s", "fifo", tmp) or [str(tmp / "s")], None, "not a directory"
    ),
    "snapshot a symlink loop": Hostile(
        lambda ref, tmp: make_special(tmp / "s", "loop", tmp) or [str(tmp / "s")], None, "not a directory"
    ),
    "base a FIFO": Hostile(
        lambda ref, tmp: make_special(tmp / "b", "fifo", tmp) or [str(ref["full"].snapshot), "--base", str(tmp / "b")],
        None,
        "--base",
    ),
    "parent missing": Hostile(
        lambda ref, tmp: [str(ref["incremental"].snapshot), "--parent", str(tmp / "p")], None, "--parent"
    ),
}

CORPUS = {**HEADERS, **DOCUMENTS, **FILES, **DIFFS, **SIGNALS, **NAMES, **USAGE}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_hostile_input_is_a_finding_or_a_usage_error(name, reference, tmp_path, capsys):
    case = CORPUS[name]
    argv = case.make(reference, tmp_path)
    with Budget("validator", name, seconds=case.seconds, rss_mb=case.rss_mb):
        as_json = validate([*argv, "--format", "json"], capsys)
        as_text = validate(argv, capsys)
    assert as_json.code == as_text.code
    if case.clause is None:
        assert as_json.code == 2, (as_json.code, as_json.out[-2000:])
        assert as_json.out == as_text.out == ""
        assert case.words in one_error_line(as_json.err)
        assert as_json.err == as_text.err
        return
    assert as_json.code == 1, (as_json.code, as_json.err[-2000:])
    assert as_json.err == as_text.err == ""
    report = json.loads(as_json.out)
    mine = [f for f in report["findings"] if f["clause"] == case.clause]
    assert any(case.words in f["message"] or case.words in (f["file"] or "") for f in mine), (
        case.words,
        [untrusted.brief_text(f"{f['clause']} {f['file']}: {f['message']}", 300) for f in report["findings"]],
    )
    assert_safe_text(as_text.out)
    assert case.text is None or case.text in as_text.out, as_text.out[-3000:]


@pytest.mark.parametrize(("encoding", "shown"), [("utf-8", "bad\\udcff-é"), ("ascii", "bad\\udcff-\\xe9")])
def test_a_non_utf8_name_prints_escaped_on_a_strict_stdout(encoding, shown, reference, tmp_path, capsys, monkeypatch):
    argv = _evil_names("", fs_name=b"bad\xff-\xc3\xa9.safetensors")(reference, tmp_path)
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding=encoding, errors="strict"))
    with Budget("validator", f"non-UTF-8 name on a strict {encoding} stdout", seconds=3, rss_mb=60):
        code = main(["validate", *argv])
    sys.stdout.flush()
    out = raw.getvalue().decode(encoding)
    assert code == 1, capsys.readouterr().err
    assert f"SNAP-INDEX-3a [SHOULD] {shown}.safetensors: is not referenced" in out
    assert_safe_text(out)


@pytest.mark.parametrize(
    "error",
    [RuntimeError("boom\nSNAP-FAKE [MUST] second line\x1b[2J"), RecursionError(), MemoryError("x" * 10**5)],
)
def test_a_crash_is_exit_3_with_one_line(error, reference, capsys, monkeypatch):
    def crash(subject: object) -> list:
        raise error

    monkeypatch.setitem(CHECKS, "SNAP-INDEX-2", dataclasses.replace(CHECKS["SNAP-INDEX-2"], fn=crash))
    with Budget("validator", f"a check raising {type(error).__name__}", seconds=3, rss_mb=60):
        run = validate([str(reference["full"].snapshot)], capsys)
    assert run.code == 3 and run.out == ""
    line = one_error_line(run.err, "rlrollout validate: internal error: ")
    assert line.startswith(f"rlrollout validate: internal error: {type(error).__name__}") and "(please report)" in line


def test_hostile_json_is_bounded_in_the_library_too():
    """The bounded parser itself: refusals, not RecursionError or MemoryError, for every shape
    (unbalanced, escaped quotes hiding brackets, brackets inside strings); the limit itself parses."""
    hostile = [
        deep(10**6),
        b'{"a":' * 10**5,
        b"[" + b"0," * 3_000_000 + b"0]",
        b'"\\' * 10**5,
        b'["\\"' + b"[" * 100 + b'"' + b"]" * 100,
        b'["' + b"[" * 10**6 + b'"' + b"[" * 65,
    ]
    with Budget("validator", "untrusted.loads on nested and oversized JSON", seconds=3, rss_mb=100, inputs=6):
        for raw in hostile:
            with pytest.raises(untrusted.BadJSON):
                untrusted.loads(raw)
        assert untrusted.loads(deep(64)) == json.loads(deep(64))
        assert untrusted.loads(b'["' + b"[" * 10**5 + b'"]') == ["[" * 10**5]  # brackets in a string do not nest
