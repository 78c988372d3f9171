"""Every command the README and the docs site show either runs here or says, on its page, why not.

A fenced `sh`, `bash` or `console` block is a list of commands (a trailing backslash continues a
line; in a `console` block only the lines after `$ ` are commands). A block is run here unless the
last line above it is a marker saying why it cannot be:

    <!-- live: needs a Fireworks deployment and its API key -->
    <!-- not run here: a server, which runs until it is stopped -->

`pip install` lines are CI's own install. Every other command of an unmarked block must be an
`rlrollout` command: it runs in this process, through `pytest_rlrollout.cli.main`, in a directory
of its own holding the snapshots the pages name (`snapshots/base`, `out/step-0042`, ...), and must
exit 0. The generated pages (the contract, the engine matrix and the reference) hold no commands
of their own and are left out.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_rlrollout.cli import main
from pytest_rlrollout.snapshot import build, tiny_moe

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GENERATED = {"contract.md", "engines.md", "reference/settings.md", "reference/commands.md", "reference/fixtures.md"}
FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!-- (live|not run here): \S.* -->$")
SHELLS = {"sh", "bash", "console"}


@dataclass(frozen=True)
class Block:
    page: str  # relative to the checkout
    line: int  # the opening fence's, 1-based
    commands: tuple[str, ...]
    marker: str | None  # why it is not run here

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    docs = [p for p in sorted(DOCS.rglob("*.md")) if p.relative_to(DOCS).as_posix() not in GENERATED]
    # the engine matrix's reports are generated with it
    return [ROOT / "README.md", *(p for p in docs if not p.relative_to(DOCS).as_posix().startswith("engines/"))]


def blocks(path: Path, root: Path = ROOT) -> list[Block]:
    """The shell blocks of one page (named relative to `root`), each with its commands and its marker."""
    found, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if opening.group(1) in SHELLS:
            above = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marker = above if MARKER.match(above) else None
            body = lines[i + 1 : end]
            found.append(Block(path.relative_to(root).as_posix(), i + 1, commands(body, opening.group(1)), marker))
        i = end + 1
    return found


def commands(body: list[str], language: str) -> tuple[str, ...]:
    if language == "console":
        body = [line[2:] for line in body if line.startswith("$ ")]
    joined = re.sub(r"\s*\\\n\s*", " ", "\n".join(body))
    return tuple(line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#"))


ALL = [b for p in pages() for b in blocks(p)]
RUN = [b for b in ALL if b.marker is None]


def test_the_pages_have_command_blocks_and_markers():
    """The extraction sees what the pages hold: blocks to run and blocks marked, README's included."""
    assert any(b.page == "README.md" for b in RUN) and any(b.marker for b in ALL)
    assert {"docs/getting-started.md", "docs/exporter-gate.md"} <= {b.page for b in RUN}


def test_every_command_is_run_here_or_marked():
    """A command of an unmarked block that this file cannot run fails, naming its page and line."""
    strays = [
        f"{b}: {c}" for b in RUN for c in b.commands if not (c.startswith("pip install") or c.startswith("rlrollout "))
    ]
    assert strays == [], (
        "add a `<!-- live: WHY -->` or `<!-- not run here: WHY -->` line above the block:\n" + "\n".join(strays)
    )


def test_a_block_without_a_marker_is_found(tmp_path):
    """The guard itself: a shell block with no marker above it is one to run; a marked one is not."""
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n```sh\nserve-forever \\\n  --port 1\n```\n\n<!-- live: a server -->\n```bash\nx\n```\n")
    found = blocks(page, root=tmp_path)
    assert [(b.line, b.commands, b.marker) for b in found] == [
        (3, ("serve-forever --port 1",), None),
        (9, ("x",), "<!-- live: a server -->"),
    ]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """Where the pages' commands run, one after another, holding what they name as an exporter
    would have written it: the base, a training step, the ARC2 diff to the next step with its
    signal, and a LoRA adapter. A command's output stays for the commands after it."""
    root = tmp_path_factory.mktemp("workspace")
    base = tiny_moe.make_base(root / "snapshots" / "base")
    out = root / "out"
    build.derive(base, out / "step-0042", build.perturbed(base, seed=1))
    target = build.derive(base, root / "targets" / "step-0043", build.perturbed(base, seed=2))
    signal = build.make_incremental(out / "step-0042", target, out / "step-0043")
    (out / "step-0043.signal.json").write_text(json.dumps(signal))
    build.make_lora(base, out / "lora-7", base_model="accounts/me/models/qwen3-30b-a3b")
    return root


# A command shown on several pages (the suite's quick start) runs once: its output is there.
EXITS: dict[str, int] = {}


@pytest.mark.xdist_group("docs-commands")  # one worker, one workspace: the quick start runs once in CI too
@pytest.mark.parametrize("block", RUN, ids=str)
def test_the_block_runs(block, workspace, pytester, monkeypatch, capsys):
    """Each command of the block exits 0, in order, in the workspace (pytester makes the suite's
    in-process runs leave this process's modules as they found them)."""
    monkeypatch.chdir(workspace)
    for command in block.commands:
        if command.startswith("pip install"):
            continue  # CI's own install
        if command not in EXITS:
            EXITS[command] = main(shlex.split(command, comments=True)[1:])
        assert EXITS[command] == 0, f"{block}: `{command}` exited {EXITS[command]}\n{capsys.readouterr().out[-3000:]}"
