"""The docs site builds with `mkdocs build --strict` (a broken link, a missing anchor or a page
missing from the docs fails it), and headless Chromium, served the built site over HTTP, shows
the landing page with its nav and the contract page with its clauses."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "mkdocs.yml"

pytestmark = pytest.mark.xdist_group("site")  # one worker builds the site once for all its tests


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once for this module's tests (about 3 s)."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(CONFIG), "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's banner about its successor is no finding
        timeout=300,
    )
    if built.returncode != 0:
        said = [line for line in built.stderr.splitlines() if line.startswith(("WARNING", "ERROR", "Aborted"))]
        pytest.fail("mkdocs build --strict is not green:\n" + "\n".join(said or built.stderr.splitlines()[-30:]))
    return out


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the test's output is the assertions'
        pass


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The built site over HTTP on a free local port (the theme's scripts and search need a
    server: a browser keeps them from file:// pages)."""
    handler = functools.partial(_Quiet, directory=str(site))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:  # its socket closed at the end
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}/"  # a fixture's teardown runs whatever its tests did
        server.shutdown()  # serve_forever returns: the thread ends


# no sandbox: CI runs as root, which Chromium's sandbox refuses; /dev/shm: a container's is too small
HEADLESS = ("--headless", "--no-sandbox", "--disable-dev-shm-usage")


def rendered(url: str, profile: Path) -> Page:
    """The DOM headless Chromium holds once `url` has loaded, its scripts run."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    browser = subprocess.run(
        [chromium, *HEADLESS, f"--user-data-dir={profile}", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert browser.returncode == 0, browser.stderr[-2000:]
    page = Page()
    page.feed(browser.stdout)
    return page


Element = tuple[str, set[str], dict[str, str]]  # tag, classes, attributes
# elements with no end tag (a browser's DOM writes them so): nothing sits inside them
VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"})


class Page(HTMLParser):
    """A page's text in document order, each piece with the elements it sits in (tag, classes,
    attributes), outermost first."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[Element] = []
        self.pieces: list[tuple[list[Element], str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in VOID:
            return
        values = {k: v or "" for k, v in attrs}
        self.open.append((tag, set(values.get("class", "").split()), values))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.open) - 1, -1, -1):  # close it and whatever the HTML left open inside it
            if self.open[i][0] == tag:
                del self.open[i:]
                return

    def handle_data(self, data: str) -> None:
        if data.strip():
            self.pieces.append((list(self.open), data.strip()))

    def texts(self, tag: str) -> list[str]:
        """The text inside the `tag` elements."""
        return [text for inside, text in self.pieces if any(t == tag for t, _, _ in inside)]

    def links_in(self, cls: str) -> set[tuple[str, str]]:
        """(text, href) of the links inside the elements of class `cls`."""
        found = set()
        for inside, text in self.pieces:
            if any(cls in c for _, c, _ in inside):
                found |= {(text, a["href"]) for t, _, a in inside if t == "a" and "href" in a}
        return found


def _nav() -> list[tuple[str | None, str]]:
    """(title, page) of every page the site's nav lists, as mkdocs reads its config."""
    from mkdocs.config import load_config

    def walk(items: list[Any]) -> Iterator[tuple[str | None, str]]:
        for item in items:
            if isinstance(item, str):
                yield None, item
            else:
                [(title, value)] = item.items()
                if isinstance(value, list):
                    yield from walk(value)
                else:
                    yield title, value

    return list(walk(load_config(str(CONFIG)).nav or []))


def _url(page: str) -> str:
    return "" if page == "index.md" else page.removesuffix(".md") + "/"


def test_the_site_builds_strict_with_every_generated_page(site):
    """Without a browser too: the build is the CI's `mkdocs build --strict`."""
    built = {p.relative_to(site).as_posix() for p in site.rglob("index.html")}
    assert {"index.html", "contract/index.html", "engines/index.html"} <= built
    assert {f"reference/{name}/index.html" for name in ("settings", "commands", "fixtures")} <= built


def test_the_landing_page_shows_its_title_and_every_page_of_the_nav(served, tmp_path):
    from mkdocs.config import load_config

    page = rendered(served, tmp_path)
    assert load_config(str(CONFIG)).site_name in page.texts("title")
    links = {(text, urljoin(served, href)) for text, href in page.links_in("md-nav--primary")}
    nav = _nav()
    for title, path in nav:
        assert any(url == urljoin(served, _url(path)) and title in (None, text) for text, url in links), (
            title,
            path,
            sorted(links),
        )
    listed = {path for _, path in nav}
    generated = ("contract.md", "engines.md", "reference/settings.md", "reference/commands.md", "reference/fixtures.md")
    assert set(generated) <= listed, "every generated page is in the site's nav"


def test_the_contract_page_shows_a_clause_under_its_id_with_its_rule(served, tmp_path):
    from pytest_rlrollout.contract import catalogue

    # a clause whose rule is plain words, so that the rendered text is the rule itself
    clause = next(c for c in catalogue() if not set(c.rule) & set("`*_<>[]\\"))
    page = rendered(urljoin(served, _url("contract.md")), tmp_path)
    assert "The RL-rollout deployment contract" in page.texts("h1")
    # the article's own headings (the table of contents beside it repeats their words as links)
    starts = [i for i, (inside, _) in enumerate(page.pieces) if inside and inside[-1][0] == "h3"]
    [heading] = [i for i in starts if page.pieces[i][1] == f"{clause.id} ({clause.level})"]
    end = next((i for i in starts if i > heading), len(page.pieces))
    section = " ".join(text for _, text in page.pieces[heading + 1 : end])
    assert clause.rule in section, (clause.id, section[:500])
