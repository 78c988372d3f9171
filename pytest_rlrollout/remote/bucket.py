"""The bucket a deployment loads snapshots from, behind fsspec: a local directory, `file://`,
`s3://` or `gs://` (the latter two need s3fs / gcsfs installed). Each snapshot is a
subdirectory named by its identity.

An object store takes its endpoint (an S3-compatible store: CoreWeave AI Object Storage, MinIO),
its credentials profile and further fsspec storage options from `Store`; credentials themselves
come from the environment or the profile, never from a setting. Files go up several at once,
with a progress line; the index goes last, so an upload cut half-way leaves no snapshot a
deployment would load (and what it put is removed).

Identities may come from anyone (a recording's run id, a deployment's status), so the bucket
takes only identities that are one path segment, and confines every path it writes, reads or
removes to its root: on this machine after resolving links, elsewhere by its segments.
"""

from __future__ import annotations

import os
import posixpath
import re
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_SEGMENT = 255  # characters: what file systems and object stores take in one name
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def segment_problem(name: object) -> str | None:
    """What keeps `name` from being one path segment (None: nothing)."""
    if not isinstance(name, str):
        return f"is {type(name).__name__}, not a string"
    if not name or name in (".", ".."):
        return "is empty" if not name else f"is {name!r}"
    if len(name) > MAX_SEGMENT:
        return f"is {len(name):,} characters long (at most {MAX_SEGMENT})"
    if "/" in name or "\\" in name:
        return "holds a path separator"
    if _CONTROL.search(name):
        return "holds a control character"
    return None


def check_identity(identity: object) -> str:
    """`identity` when it is one path segment; ValueError saying what is wrong otherwise."""
    problem = segment_problem(identity)
    if problem is not None:
        raise ValueError(f"snapshot identity {str(identity)[:80]!r} {problem}: an identity is one path segment")
    return identity  # type: ignore[return-value]


def _relative(name: str) -> str:
    """`name`, a file's path inside a snapshot (`a/b.safetensors`), when every segment is one."""
    parts = name.split("/")
    for part in parts:
        problem = segment_problem(part)
        if problem is not None:
            raise ValueError(f"file name {name[:120]!r} has a part that {problem}")
    return name


# what a snapshot's loader reads first: put last, in this order, the index the very last, so
# that a cut upload leaves no index (and no deployment loads what it left)
LAST = ("adapter_config.json", "config.json", "model.weight.spec.json", "model.safetensors.index.json")
SECRET_OPTIONS = frozenset(
    {
        "key",
        "secret",
        "token",
        "password",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "session_token",
        "credentials",
    }
)


class BucketError(OSError):
    """The store refused or failed: the message says what and where."""


@dataclass(frozen=True)
class Store:
    """How to reach an object store: what fsspec is given (`rl_bucket_*` settings)."""

    endpoint_url: str | None = None  # s3:// and gs://: an S3-compatible or GCS-compatible endpoint
    profile: str | None = None  # s3://: the credentials profile (~/.aws/credentials)
    concurrency: int = 4  # files in flight at once
    options: Mapping[str, Any] = field(default_factory=dict)  # further fsspec storage options

    def storage_options(self, protocol: str) -> dict[str, Any]:
        """The fsspec storage options for a bucket of `protocol`; ValueError for what cannot apply."""
        secret = sorted(SECRET_OPTIONS & set(self.options))
        if secret:
            raise ValueError(
                f"storage options {secret} hold credentials: give them in the environment or a profile, "
                "never in a setting (a setting lands in git and in reports)"
            )
        out = dict(self.options)
        if self.endpoint_url is not None:
            if protocol not in ("s3", "gs", "gcs"):
                raise ValueError(f"an endpoint URL applies to s3:// and gs:// buckets, not {protocol}://")
            out["endpoint_url"] = self.endpoint_url
        if self.profile is not None:
            if protocol != "s3":
                raise ValueError(f"a credentials profile applies to s3:// buckets, not {protocol}://")
            out["profile"] = self.profile
        return out


@dataclass(frozen=True)
class Progress:
    """An upload under way: what `Bucket(progress=)` is told, at most once a second and at the end."""

    identity: str
    done: int  # bytes
    total: int
    files_done: int
    files: int
    in_flight: int
    seconds: float

    def line(self) -> str:
        rate = self.done / self.seconds if self.seconds > 0 else 0.0
        left = f", {(self.total - self.done) / rate:.0f} s left" if rate > 0 and self.done < self.total else ""
        return (
            f"uploading {self.identity}: {self.done / 1e9:.2f} of {self.total / 1e9:.2f} GB, "
            f"{self.files_done}/{self.files} files ({self.in_flight} in flight), {rate / 1e6:.0f} MB/s{left}"
        )


@dataclass
class Transfer:
    """What putting files in the bucket cost, in bytes."""

    sent: int = 0  # from this machine (on a bucket on this machine: copied into it)
    copied: int = 0  # by the store, from a snapshot it holds: nothing passed through this machine
    linked: int = 0  # shared by a hard link (a bucket on this machine): nothing written
    files: int = 0
    most_in_flight: int = 0  # files in flight at once, at most

    def __iadd__(self, other: Transfer) -> Transfer:
        self.sent, self.copied = self.sent + other.sent, self.copied + other.copied
        self.linked, self.files = self.linked + other.linked, self.files + other.files
        return self


class Bucket:
    def __init__(
        self,
        url: str | os.PathLike[str],
        store: Store | None = None,
        *,
        progress: Callable[[Progress], None] | None = None,
    ):
        import fsspec

        text = os.fspath(url).rstrip("/")
        if "://" not in text:
            text = Path(text).resolve().as_uri()
        self.url = text
        self.store = store or Store()
        self.progress = progress
        try:
            options = self.store.storage_options(text.split("://", 1)[0])
            self.fs, self.root = fsspec.core.url_to_fs(text, **options)
        except (ImportError, ValueError, TypeError) as e:
            raise ValueError(f"bucket {text}: {e}") from None
        self.root = self.root.rstrip("/")

    def check(self) -> None:
        """Ask the store once whether the bucket is there and these credentials may use it:
        BucketError saying which it is not."""
        try:
            if self.local_path is None:  # the store's bucket (a prefix under it exists once written to)
                self.fs.ls(self.root.split("/", 1)[0], detail=False, refresh=True)
        except FileNotFoundError:
            raise BucketError(f"bucket {self.url} does not exist (or is not visible to these credentials)") from None
        except PermissionError as e:
            raise BucketError(f"bucket {self.url}: the store refused these credentials ({_reason(e)})") from None
        except Exception as e:  # no credentials at all, an endpoint that does not answer, ...: the store's words
            raise BucketError(f"bucket {self.url}: the store could not be asked ({_reason(e)})") from None
        if self.local_path is not None and not self.local_path.is_dir():
            raise BucketError(f"bucket {self.url}: no such directory")

    def __repr__(self) -> str:
        return f"Bucket({self.url!r})"

    @property
    def local_path(self) -> Path | None:
        """The directory, when the bucket is on this machine."""
        return Path(self.root) if self.url.startswith("file://") else None

    def _confined(self, path: str) -> str:
        """`path` when it lies inside the root: on this machine once links are resolved (a link
        planted in the bucket leads nowhere else), elsewhere once normalised."""
        local = self.local_path
        if local is not None:
            inside = Path(path).resolve().is_relative_to(local.resolve())
        else:
            inside = posixpath.normpath(path).startswith(posixpath.normpath(self.root) + "/")
        if not inside:
            raise ValueError(f"{path} leads out of the bucket {self.url}")
        return path

    def path(self, identity: str, name: str | None = None) -> str:
        """Where a snapshot (or one of its files) is; ValueError for anything that would lead
        elsewhere: an identity that is not one segment, a file name with '..', a link out."""
        base = f"{self.root}/{check_identity(identity)}"
        return self._confined(base if name is None else f"{base}/{_relative(name)}")

    def identities(self) -> list[str]:
        """The names at the bucket's top level (its snapshots), sorted."""
        if not self.fs.exists(self.root):
            return []
        return sorted(posixpath.basename(p.rstrip("/")) for p in self.fs.ls(self.root, detail=False))

    def tree_size(self, identity: str) -> int:
        """The bytes of every file of a snapshot."""
        return sum(self.fs.du(self.path(identity), total=False).values()) if self.exists(identity) else 0

    def exists(self, identity: str) -> bool:
        return self.fs.exists(self.path(identity))

    def upload(self, local: str | os.PathLike[str], identity: str) -> int:
        """Copy a snapshot directory (subdirectories included) to `<bucket>/<identity>/`;
        returns the bytes sent."""
        local = Path(local)
        files = {f.relative_to(local).as_posix(): f for f in sorted(p for p in local.rglob("*") if p.is_file())}
        return self.put(identity, files, link=False).sent

    def put(
        self,
        identity: str,
        files: Mapping[str, Path],
        *,
        same: Mapping[str, Path] | None = None,
        source: str | None = None,
        link: bool = True,
    ) -> Transfer:
        """Make snapshot `identity` of `files` (name -> a file on this machine) and `same`
        (name -> a file on this machine whose bytes the bucket's snapshot `source` holds under
        that name). Nothing is sent that need not be: a bucket on this machine hard-links
        (`link`) where it can; an object store copies `same` from `source` itself. A put that
        fails removes what it made, so no half snapshot is left under an identity."""
        if self.exists(identity):
            raise FileExistsError(f"{self.url}/{identity} already exists; identities must be new")
        jobs = sorted(
            [(n, f, False) for n, f in files.items()] + [(n, f, source is not None) for n, f in (same or {}).items()],
            key=lambda job: (LAST.index(job[0]) if job[0] in LAST else -1, job[0]),
        )
        watch = _Watch(identity, sum(f.stat().st_size for _, f, _ in jobs), len(jobs), self.progress)
        made, lock = {self.path(identity)}, threading.Lock()

        def one(job: tuple[str, Path, bool]) -> Transfer:
            name, f, held = job
            target = self.path(identity, name)
            parent = posixpath.dirname(target)
            with lock:  # made before any file goes in: a local file system makes no parents of its own
                if parent not in made:
                    self.fs.makedirs(parent, exist_ok=True)
                    made.add(parent)
            with watch.file(f.stat().st_size):
                return self._put_file(f, target, self.path(source, name) if held and source is not None else None, link)

        done = Transfer()
        try:
            self.fs.makedirs(self.path(identity), exist_ok=True)
            first = [job for job in jobs if job[0] not in LAST]
            with ThreadPoolExecutor(max(1, self.store.concurrency), thread_name_prefix="upload") as pool:
                for moved in pool.map(one, first):
                    done += moved
            for job in jobs[len(first) :]:  # the index and config last, one by one
                done += one(job)
        except BaseException as e:
            left = self._removed_after_failure(identity)
            if isinstance(e, Exception) and (left or self.local_path is None):
                raise BucketError(f"upload of {identity} to {self.url} failed ({_reason(e)}){left}") from e
            raise
        watch.end()
        done.most_in_flight = watch.most_in_flight
        return done

    def _removed_after_failure(self, identity: str) -> str:
        """Remove what a failed put made; '' once it is gone, else what to tell a person."""
        try:
            self.remove(identity)
            return ""
        except Exception as e:  # the store is gone too: say what is left and how to sweep it
            return (
                f"; what it put could not be removed ({_reason(e)}): {self.url}/{identity} is left without "
                f"its index (no deployment loads it); `rlrollout cleanup --rl-bucket-url {self.url}` removes it"
            )

    def _put_file(self, local: Path, target: str, held: str | None, link: bool) -> Transfer:
        size = local.stat().st_size
        if self.local_path is not None:
            origins = ([held] if held is not None and os.path.exists(held) else []) + [str(local)]
            if link and any(_linked(origin, target) for origin in origins):
                return Transfer(linked=size, files=1)
        elif held is not None and self.fs.exists(held):
            self.fs.copy(held, target)
            return Transfer(copied=size, files=1)
        self.fs.put_file(str(local), target)
        return Transfer(sent=size, files=1)

    def copy(self, source: str, identity: str, *, inner: str | None = None) -> Transfer:
        """Copy snapshot `source` to `identity` (or to `identity/inner`) inside the bucket: on an
        object store the store copies it and on this machine files are hard-linked where they
        can be, so nothing passes through this machine."""
        dst = self.path(identity) if inner is None else self.path(identity, inner)
        if self.fs.exists(dst):
            raise FileExistsError(f"{self.url}/{identity} already exists; identities must be new")
        src = self.path(source)
        done = Transfer()
        try:
            for f in sorted(f for f in self.fs.find(src) if self.fs.isfile(f)):
                name = posixpath.relpath(f, src)
                target = self.path(identity, name if inner is None else f"{inner}/{name}")
                self.fs.makedirs(posixpath.dirname(target), exist_ok=True)
                if self.local_path is not None and _linked(f, target):
                    done += Transfer(linked=os.path.getsize(f), files=1)
                    continue
                self.fs.copy(f, target)
                done += Transfer(copied=self.fs.size(f), files=1)
        except BaseException:
            self.remove(identity)
            raise
        return done

    def remove(self, identity: str) -> None:
        """Remove a snapshot and everything under it (nothing when there is none)."""
        if self.exists(identity):
            self.fs.rm(self.path(identity), recursive=True)

    def remove_file(self, identity: str, name: str) -> None:
        self.fs.rm(self.path(identity, name))

    def size(self, identity: str, name: str) -> int:
        """The size of one file of a snapshot; FileNotFoundError when it has none of that name."""
        return self.fs.size(self.path(identity, name))

    def read_text(self, identity: str, name: str) -> str:
        with self.fs.open(self.path(identity, name), "r") as f:
            return f.read()


def _linked(origin: str, target: str) -> bool:
    """Hard-link `target` to `origin`; False where it cannot be (another file system, links
    refused), for the caller to copy instead."""
    try:
        os.link(origin, target)
        return True
    except OSError:
        return False


def _reason(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[:300]}"


class _Watch:
    """Counts an upload's bytes and files in flight; tells `progress` at most once a second."""

    def __init__(self, identity: str, total: int, files: int, progress: Callable[[Progress], None] | None):
        self.identity, self.total, self.files, self.progress = identity, total, files, progress
        self.done = self.files_done = self.in_flight = self.most_in_flight = 0
        self.start = self.told = time.monotonic()
        self.lock = threading.Lock()

    def file(self, size: int) -> _File:
        return _File(self, size)

    def _tell(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.progress is not None and (force or now - self.told >= 1.0):
            self.told = now
            self.progress(
                Progress(
                    self.identity, self.done, self.total, self.files_done, self.files, self.in_flight, now - self.start
                )
            )

    def end(self) -> None:
        with self.lock:
            self._tell(force=True)


class _File:
    def __init__(self, watch: _Watch, size: int):
        self.watch, self.size = watch, size

    def __enter__(self) -> None:
        w = self.watch
        with w.lock:
            w.in_flight += 1
            w.most_in_flight = max(w.most_in_flight, w.in_flight)
            w._tell()

    def __exit__(self, kind, value, tb) -> None:
        w = self.watch
        with w.lock:
            w.in_flight -= 1
            if kind is None:
                w.done, w.files_done = w.done + self.size, w.files_done + 1
            w._tell()


class DryBucket(Bucket):
    """A bucket that writes nothing and says what each write would cost: a run's plan prices its
    snapshots on it. It reads the real bucket (does it hold the base?), and what it would have
    made exists only in it. A bucket on this machine links what is on its own file system (what
    `put` and `copy` try first); an object store copies what it holds and is sent the rest."""

    def __init__(self, real: Bucket):
        self.url, self.store, self.progress, self.fs, self.root = real.url, real.store, None, real.fs, real.root
        self._made: dict[str, dict[str, int]] = {}  # identity -> file name -> size

    def __repr__(self) -> str:
        return f"DryBucket({self.url!r})"

    def exists(self, identity: str) -> bool:
        return identity in self._made or super().exists(identity)

    def _links(self, origin: Path) -> bool:
        """Whether a file on this machine would be hard-linked into this bucket (one file system)."""
        local = self.local_path
        return local is not None and local.is_dir() and origin.stat().st_dev == local.stat().st_dev

    def put(
        self,
        identity: str,
        files: Mapping[str, Path],
        *,
        same: Mapping[str, Path] | None = None,
        source: str | None = None,
        link: bool = True,
    ) -> Transfer:
        if self.exists(identity):
            raise FileExistsError(f"{self.url}/{identity} already exists; identities must be new")
        done, made = Transfer(), self._made.setdefault(identity, {})
        for name, f, held in [
            *((n, f, False) for n, f in files.items()),
            *((n, f, source is not None) for n, f in (same or {}).items()),
        ]:
            size = made[name] = f.stat().st_size
            if link and self.local_path is not None and (held or self._links(f)):
                done += Transfer(linked=size, files=1)
            elif held and self.local_path is None:
                done += Transfer(copied=size, files=1)
            else:
                done += Transfer(sent=size, files=1)
        done.most_in_flight = min(done.files, max(1, self.store.concurrency))
        return done

    def copy(self, source: str, identity: str, *, inner: str | None = None) -> Transfer:
        if (identity in self._made and inner is None) or super().exists(identity):
            raise FileExistsError(f"{self.url}/{identity} already exists; identities must be new")
        if source in self._made:
            sizes = self._made[source]
        else:
            src = self.path(source)
            sizes = {posixpath.relpath(f, src): self.fs.size(f) for f in self.fs.find(src) if self.fs.isfile(f)}
        links = self.local_path is not None  # a bucket on this machine links its own files
        made = self._made.setdefault(identity, {})
        for name, size in sizes.items():
            made[name if inner is None else f"{inner}/{name}"] = size
        total = sum(sizes.values())
        return Transfer(linked=total, files=len(sizes)) if links else Transfer(copied=total, files=len(sizes))

    def remove(self, identity: str) -> None:
        self._made.pop(identity, None)

    def remove_file(self, identity: str, name: str) -> None:
        self._made.get(identity, {}).pop(name, None)

    def size(self, identity: str, name: str) -> int:
        if identity in self._made:
            return self._made[identity][name]
        return super().size(identity, name)
