"""ARC2 (`arc_v2`) incremental snapshots: per tensor, one zstd frame of parent XOR target bytes.

A diff file is a safetensors file whose entries are 1-D U8 payloads, with `__metadata__`
mapping each tensor name to the decimal Adler-32 of the *target* bytes. Decoding streams
every tensor through fixed-size chunks (decompress → XOR with the parent → checksum →
write), so memory stays bounded by the chunk size per thread whatever the tensor size;
zstd, numpy and zlib release the GIL, so threads scale across cores. `arc_v1` (zlib) is
read as well; `arc_v3` payloads are pickles and are refused, never decoded.
"""

from __future__ import annotations

import functools
import io
import os
import tempfile
import threading
import zlib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

import numpy as np
import zstandard

from pytest_rlrollout.snapshot import safetensors_io as st

FORMATS = ("arc_v2", "arc_v1")
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ARC3_MAGIC = b"ARC3_ENVELOPE\x00"
CHUNK = 1 << 20  # fits in L2: decompress, XOR, checksum and write without touching DRAM twice
LEVEL = 3  # the level fireworks-delta-compression uses


class DeltaError(ValueError):
    """A diff that cannot be applied; names the file and tensor."""

    def __init__(self, message: str, *, file: str | None = None, tensor: str | None = None):
        where = [x for x in (file, tensor and f"tensor {tensor!r}") if x]
        super().__init__(": ".join([*where, message]))
        self.file, self.tensor = file, tensor


def default_threads() -> int:
    return max(1, min(8, os.cpu_count() or 1))


# --------------------------------------------------------------------------- streams over file ranges


class _RangeReader(io.RawIOBase):
    """A read-only stream over bytes [start, end) of an open file descriptor (pread, no seek races)."""

    def __init__(self, fd: int, start: int, end: int):
        self._fd, self._pos, self._end = fd, start, end

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        want = min(len(buf), self._end - self._pos)
        if want <= 0:
            return 0
        n = os.preadv(self._fd, [memoryview(buf)[:want]], self._pos)
        self._pos += n
        return n


class _Buffers(threading.local):
    def __init__(self):
        self.parent = bytearray(CHUNK)
        self.other = bytearray(CHUNK)


_buffers = _Buffers()


def _read_exact(fd: int, buf: memoryview, offset: int) -> None:
    got = 0
    while got < len(buf):
        n = os.preadv(fd, [buf[got:]], offset + got)
        if n == 0:
            raise DeltaError(f"file ended at byte {offset + got}")
        got += n


# --------------------------------------------------------------------------- decode


@dataclass(frozen=True)
class _Job:
    name: str
    file: str
    parent_fd: int
    parent: st.TensorInfo
    diff_fd: int
    payload: st.TensorInfo
    checksum: str
    out_fd: int | None  # None: verify only


def _decompressor(fmt: str, fd: int, payload: st.TensorInfo):
    if fmt == "arc_v2":
        # a cast: zstandard reads its source only through read(size), which a RawIOBase has; its
        # stub asks for an IO[bytes], which RawIOBase is not to typeshed
        source = cast("IO[bytes]", _RangeReader(fd, payload.start, payload.end))
        return zstandard.ZstdDecompressor().stream_reader(source, read_size=CHUNK, read_across_frames=True)
    return _ZlibStream(_RangeReader(fd, payload.start, payload.end))


class _ZlibStream(io.RawIOBase):
    def __init__(self, src: _RangeReader):
        self._src, self._z, self._pending = src, zlib.decompressobj(), b""

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while not self._pending:
            if self._z.eof:
                if self._z.unused_data or self._src.read(1):
                    raise zlib.error("data after the end of the zlib stream")
                return 0
            block = self._src.read(256 << 10)
            if not block:
                raise zlib.error("truncated zlib stream")
            self._pending = self._z.decompress(block, CHUNK)
            while self._z.unconsumed_tail and not self._pending:
                self._pending = self._z.decompress(self._z.unconsumed_tail, CHUNK)
        n = min(len(buf), len(self._pending))
        buf[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


def _check_frame(job: _Job, fmt: str) -> None:
    buf = bytearray(min(18, job.payload.nbytes))  # a zstd frame header is at most 18 bytes
    if buf:
        _read_exact(job.diff_fd, memoryview(buf), job.payload.start)
    head = bytes(buf)
    if head.startswith(ARC3_MAGIC):
        raise DeltaError("payload is an arc_v3 pickle envelope; it is never decoded", file=job.file, tensor=job.name)
    if fmt == "arc_v2":
        if not head.startswith(ZSTD_MAGIC):
            raise DeltaError("payload is not a zstd frame", file=job.file, tensor=job.name)
        try:
            declared = zstandard.frame_content_size(head)
        except zstandard.ZstdError:
            declared = -1
        if declared not in (-1, job.parent.nbytes):
            raise DeltaError(
                f"zstd frame declares {declared} bytes, the parent tensor has {job.parent.nbytes}",
                file=job.file,
                tensor=job.name,
            )


def _run(job: _Job, fmt: str) -> None:
    _check_frame(job, fmt)
    bufs = _buffers
    n = job.parent.nbytes
    adler = zlib.adler32(b"")
    done = 0
    try:
        with _decompressor(fmt, job.diff_fd, job.payload) as stream:
            while done < n:
                want = min(CHUNK, n - done)
                delta = memoryview(bufs.other)[:want]
                got = 0
                while got < want:
                    k = stream.readinto(delta[got:])
                    if k == 0:
                        raise DeltaError(
                            f"decoded payload is {done + got} bytes, the parent tensor has {n}",
                            file=job.file,
                            tensor=job.name,
                        )
                    got += k
                parent = memoryview(bufs.parent)[:want]
                _read_exact(job.parent_fd, parent, job.parent.start + done)
                p = np.frombuffer(parent, dtype=np.uint8)
                np.bitwise_xor(p, np.frombuffer(delta, dtype=np.uint8), out=p)
                adler = zlib.adler32(parent, adler)
                if job.out_fd is not None:
                    os.pwrite(job.out_fd, parent, job.parent.start + done)
                done += want
            if stream.read(1):
                raise DeltaError(
                    f"decoded payload is longer than the parent tensor's {n} bytes", file=job.file, tensor=job.name
                )
    except (zstandard.ZstdError, zlib.error) as e:
        raise DeltaError(f"payload does not decompress: {e}", file=job.file, tensor=job.name) from None
    if str(adler) != job.checksum:
        raise DeltaError(
            f"Adler-32 of the result is {adler}, the diff's __metadata__ says {job.checksum}",
            file=job.file,
            tensor=job.name,
        )


def _jobs_for(
    file: str, parent_fd: int, parent: st.Header, diff_fd: int, diff: st.Header, out_fd: int | None
) -> list[_Job]:
    if set(parent.tensors) != set(diff.tensors):
        missing = sorted(set(parent.tensors) - set(diff.tensors))
        extra = sorted(set(diff.tensors) - set(parent.tensors))
        raise DeltaError(f"tensor sets differ: missing {missing[:5]}, extra {extra[:5]}", file=file)
    jobs = []
    for name, p in parent.tensors.items():
        d = diff.tensors[name]
        if d.dtype != "U8" or len(d.shape) != 1:
            raise DeltaError(f"payload is {d.dtype}{list(d.shape)}, not a 1-D U8 array", file=file, tensor=name)
        checksum = diff.metadata.get(name)
        if checksum is None or not checksum.isdigit():
            raise DeltaError(f"__metadata__ has no decimal Adler-32 (got {checksum!r})", file=file, tensor=name)
        jobs.append(_Job(name, file, parent_fd, p, diff_fd, d, checksum, out_fd))
    return jobs


def check_structure(parent: st.Header, diff: st.Header, file: str) -> None:
    """The checks that need no tensor data: tensor sets, payload dtype/shape, checksums present."""
    _jobs_for(file, -1, parent, -1, diff, None)


@dataclass(frozen=True)
class FilePlan:
    name: str
    parent: Path
    diff: Path
    out: Path | None = None


def apply_files(plans: Iterable[FilePlan], *, fmt: str = "arc_v2", threads: int | None = None) -> None:
    """Decode diff files over their parents; with `out` set, write the targets (the parent is
    never modified); without, only verify sizes and checksums. Raises DeltaError on the first
    failure, leaving no partial output behind."""
    if fmt not in FORMATS:
        raise DeltaError(f"compression format {fmt!r} is not supported (supported: {', '.join(FORMATS)})")
    plans = list(plans)
    fds: list[int] = []
    outputs: list[Path] = []
    try:
        jobs: list[_Job] = []
        for plan in plans:
            try:
                ph, dh = st.read_header(plan.parent), st.read_header(plan.diff)
            except st.HeaderError as e:
                raise DeltaError(str(e), file=plan.name) from None
            pfd, dfd = os.open(plan.parent, os.O_RDONLY), os.open(plan.diff, os.O_RDONLY)
            fds += [pfd, dfd]
            ofd = None
            if plan.out is not None:
                tmp = Path(f"{plan.out}.partial")
                outputs.append(tmp)
                ofd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                fds.append(ofd)
                os.ftruncate(ofd, ph.size)
                # The parent's header, byte for byte: diffs never change names, dtypes or shapes.
                head = bytearray(ph.data_start)
                _read_exact(pfd, memoryview(head), 0)
                os.pwrite(ofd, head, 0)
            jobs += _jobs_for(plan.name, pfd, ph, dfd, dh, ofd)
        jobs.sort(key=lambda j: -j.parent.nbytes)  # big tensors first balance the threads
        workers = threads or default_threads()
        if workers == 1:
            for job in jobs:
                _run(job, fmt)
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="arc2") as pool:
                for f in [pool.submit(_run, job, fmt) for job in jobs]:
                    f.result()
        for out, tmp in zip([p.out for p in plans if p.out is not None], outputs, strict=True):
            os.replace(tmp, out)
        outputs.clear()
    finally:
        for fd in fds:
            os.close(fd)
        for tmp in outputs:
            tmp.unlink(missing_ok=True)


def apply_file(parent: str | os.PathLike, diff: str | os.PathLike, out: str | os.PathLike, **kw) -> None:
    apply_files([FilePlan(Path(diff).name, Path(parent), Path(diff), Path(out))], **kw)


def verify_file(parent: str | os.PathLike, diff: str | os.PathLike, **kw) -> None:
    apply_files([FilePlan(Path(diff).name, Path(parent), Path(diff))], **kw)


# --------------------------------------------------------------------------- encode


def _compress_tensor(pfd: int, p: st.TensorInfo, tfd: int, t: st.TensorInfo) -> tuple[memoryview, str]:
    """One zstd frame of parent XOR target, fed in chunks; returns (payload, Adler-32 of target)."""
    bufs = _buffers
    n = p.nbytes
    sink = io.BytesIO()
    adler = zlib.adler32(b"")
    cctx = zstandard.ZstdCompressor(level=LEVEL, write_content_size=True, write_checksum=False)
    with cctx.stream_writer(sink, size=n, closefd=False) as w:
        done = 0
        while done < n:
            want = min(CHUNK, n - done)
            a, b = memoryview(bufs.parent)[:want], memoryview(bufs.other)[:want]
            _read_exact(pfd, a, p.start + done)
            _read_exact(tfd, b, t.start + done)
            adler = zlib.adler32(b, adler)
            x = np.frombuffer(a, dtype=np.uint8)
            np.bitwise_xor(x, np.frombuffer(b, dtype=np.uint8), out=x)
            w.write(a)
            done += want
    return sink.getbuffer(), str(adler)


def encode_file(
    parent: str | os.PathLike, target: str | os.PathLike, out: str | os.PathLike, *, threads: int | None = None
) -> None:
    """Write the arc_v2 diff turning `parent` into `target` (same tensors, dtypes and shapes)."""
    ph, th = st.read_header(parent), st.read_header(target)
    file = Path(target).name
    if set(ph.tensors) != set(th.tensors):
        missing = sorted(set(ph.tensors) ^ set(th.tensors))
        raise DeltaError(f"parent and target hold different tensors: {missing[:5]}", file=file)
    for name, p in ph.tensors.items():
        t = th.tensors[name]
        if (p.dtype, p.shape) != (t.dtype, t.shape):
            raise DeltaError(
                f"parent is {p.dtype}{list(p.shape)}, target is {t.dtype}{list(t.shape)}", file=file, tensor=name
            )
    lock = threading.Lock()
    end = 0
    pfd, tfd = os.open(parent, os.O_RDONLY), os.open(target, os.O_RDONLY)
    # Payload sizes are known only after compressing: spool payloads, then write header + data.
    with tempfile.NamedTemporaryFile(dir=Path(out).parent, prefix=".arc2-spool-") as spool:
        try:

            def one(name: str) -> tuple[str, str, int, int]:
                nonlocal end
                payload, checksum = _compress_tensor(pfd, ph.tensors[name], tfd, th.tensors[name])
                with lock:
                    offset, end = end, end + len(payload)
                os.pwrite(spool.fileno(), payload, offset)
                return name, checksum, offset, len(payload)

            names = sorted(ph.tensors, key=lambda n: -ph.tensors[n].nbytes)
            workers = threads or default_threads()
            if workers == 1:
                results = [one(n) for n in names]
            else:
                with ThreadPoolExecutor(workers, thread_name_prefix="arc2") as pool:
                    results = list(pool.map(one, names))
        finally:
            os.close(pfd)
            os.close(tfd)
        entries = [
            st.Entry(name, "U8", (size,), st.FileRange(Path(spool.name), off, off + size))
            for name, _, off, size in results
        ]
        st.write_file(out, entries, {name: checksum for name, checksum, _, _ in results})


@functools.lru_cache(maxsize=1024)
def _zero_frame(n: int) -> bytes:
    """One zstd frame of `n` zero bytes (an unchanged tensor), fed in chunks. Kept per size: a
    model has few tensor sizes (Qwen3-30B-A3B: 18,867 tensors, a dozen sizes), and a sentinel
    of one would otherwise compress 61 GB of zeros every time."""
    sink = io.BytesIO()
    zeros = bytes(min(CHUNK, n))
    cctx = zstandard.ZstdCompressor(level=LEVEL, write_content_size=True, write_checksum=False)
    with cctx.stream_writer(sink, size=n, closefd=False) as w:
        done = 0
        while done < n:
            want = min(CHUNK, n - done)
            w.write(zeros[:want])
            done += want
    return sink.getvalue()


def encode_changes(
    parent: str | os.PathLike,
    out: str | os.PathLike,
    changes: dict[str, tuple[bytes, bytes]],
    checksums: dict[str, str],
) -> int:
    """The arc_v2 diff of a file in which only `changes` (name -> (parent bytes, target bytes))
    differ; every other tensor is a zero frame whose target checksum comes from `checksums`.
    Reads only the parent's header, so a one-tensor change of a large snapshot costs a few
    kilobytes per file. Returns the diff file's size."""
    header = st.read_header(parent)
    entries, metadata = [], {}
    for name, info in header.tensors.items():
        if name in changes:
            old, new = changes[name]
            if len(old) != info.nbytes or len(new) != info.nbytes:
                raise DeltaError(f"change of {len(new)} bytes for a tensor of {info.nbytes}", tensor=name)
            xor = np.bitwise_xor(np.frombuffer(old, np.uint8), np.frombuffer(new, np.uint8))
            payload = zstandard.ZstdCompressor(level=LEVEL, write_content_size=True).compress(xor.tobytes())
            metadata[name] = str(zlib.adler32(new))
        else:
            if name not in checksums:
                raise DeltaError("no checksum for an unchanged tensor", tensor=name)
            payload, metadata[name] = _zero_frame(info.nbytes), checksums[name]
        entries.append(st.Entry(name, "U8", (len(payload),), st.Tensor.of(np.frombuffer(payload, np.uint8))))
    st.write_file(out, entries, metadata)
    return Path(out).stat().st_size
