"""Downloading a known dataset's canonical ``.gz`` files (standard library HTTP only).

Each file is streamed into a temporary file next to its target, verified (``verify``: the
canonical MD5, or the content SHA-256 for a re-compressed copy) and only then renamed into
place; a file that fails is deleted. A file already present and verified is kept as it is;
one present that does not verify is never overwritten (it may be another dataset's file of
the same name). Mirrors are tried in order; every failure is reported on one line.
"""

from __future__ import annotations

import dataclasses
import http.client
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .catalogue import IdxFile, KnownDataset
from .errors import DatasetError, one_line
from .verify import FileCheck, check_idx_file

CHUNK = 1 << 16
SCHEMES = ("http", "https", "file")


class FetchError(DatasetError):
    """A download failed (HTTP error, unreachable host, timeout) or its file did not verify."""


class FetchProgress(Protocol):
    """Receives the progress of each download (bytes)."""

    def start(self, name: str, total: int) -> None: ...

    def advance(self, nbytes: int) -> None: ...

    def finish(self) -> None: ...


@dataclass(frozen=True)
class Fetched:
    """One file of a fetch: where it is, how it verified, and the URL it came from (None when
    it was already there)."""

    path: Path
    check: FileCheck
    url: str | None


def file_url(base: str, name: str) -> str:
    """A mirror's base URL joined with a file name (with or without a trailing slash on ``base``)."""
    return base.rstrip("/") + "/" + name


def _check_mirror(base: str) -> None:
    scheme = urllib.parse.urlsplit(base).scheme
    if scheme not in SCHEMES:
        raise FetchError(f"mirror {base!r}: the URL must start with http://, https:// or file://")


def fetch_dataset(
    dataset: KnownDataset,
    to: str | Path,
    mirror: str | None = None,
    timeout: float = 60.0,
    progress: FetchProgress | None = None,
) -> list[Fetched]:
    """Fetch every ``.gz`` file of ``dataset`` into directory ``to`` (created if needed)
    from ``mirror`` (a base URL) or else the catalogue's mirrors; ``timeout`` in seconds per
    connection and read. FetchError (one line) on the first file that cannot be had."""
    if dataset.bundled:
        raise FetchError(f"{dataset.name} ships with {dataset.bundled}; there is nothing to fetch")
    mirrors = (mirror,) if mirror else dataset.mirrors
    for base in mirrors:
        _check_mirror(base)
    to = Path(to)
    try:
        to.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FetchError(f"{to}: cannot create the directory: {one_line(exc)}") from exc
    return [_fetch_file(spec, to, dataset, mirrors, timeout, progress) for spec in dataset.files]


def _fetch_file(spec: IdxFile, to: Path, dataset: KnownDataset, mirrors: tuple[str, ...],
                timeout: float, progress: FetchProgress | None) -> Fetched:
    target = to / spec.gz_name
    for existing in (to / spec.name, target):
        if existing.exists():
            check = check_idx_file(existing, spec)
            if not check.ok:
                raise FetchError(f"{existing} exists but is not {dataset.name}'s {spec.name} ({check.how}); "
                                 "move it away or fetch into another directory")
            return Fetched(existing, check, None)
    failures = []
    for base in mirrors:
        url = file_url(base, spec.gz_name)
        try:
            check = _download(url, target, spec, timeout, progress)
        except FetchError as exc:
            failures.append(str(exc))
            continue
        return Fetched(target, check, url)
    raise FetchError(f"{dataset.name}: could not fetch {spec.gz_name}: {'; '.join(failures)}")


def _download(url: str, target: Path, spec: IdxFile, timeout: float,
              progress: FetchProgress | None) -> FileCheck:
    """Stream ``url`` into a temporary file beside ``target``, verify it, rename it into place."""
    # gzip never grows data by more than a few bytes per 32 KiB block: anything longer is wrong
    limit = spec.content_size + (1 << 20)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{spec.gz_name}.", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    started = False
    try:
        with os.fdopen(fd, "wb") as out:
            request = urllib.request.Request(url, headers={"User-Agent": "fedsdk-server datasets fetch"})
            with urllib.request.urlopen(request, timeout=timeout) as response:
                length = response.headers.get("Content-Length")
                total = int(length) if length and length.isdigit() else None
                if total is not None and total > limit:
                    raise FetchError(f"{url}: the server announces {total} bytes, more than the file can be")
                if progress:
                    progress.start(spec.gz_name, total or spec.gz_size)
                    started = True
                received = 0
                while chunk := response.read(CHUNK):
                    received += len(chunk)
                    if received > limit:
                        raise FetchError(f"{url}: the server sends more than {limit} bytes; stopped")
                    out.write(chunk)
                    if progress:
                        progress.advance(len(chunk))
                if total is not None and received != total:
                    raise FetchError(f"{url}: the connection ended after {received} of {total} bytes")
            out.flush()
            os.fsync(out.fileno())
        check = check_idx_file(tmp, spec)
        if not check.ok:
            raise FetchError(f"{url}: the downloaded file failed verification ({check.how}); not kept")
        tmp.chmod(0o644)
        os.replace(tmp, target)
        return dataclasses.replace(check, path=target, label=target.name)
    except urllib.error.HTTPError as exc:
        raise FetchError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise FetchError(_unreachable(url, exc.reason, timeout)) from None
    except TimeoutError:
        raise FetchError(f"{url}: timed out after {timeout:g} s") from None
    except (OSError, http.client.HTTPException) as exc:
        raise FetchError(f"{url}: download failed: {one_line(exc)}") from None
    finally:
        if started and progress:
            progress.finish()
        tmp.unlink(missing_ok=True)


def _unreachable(url: str, reason: object, timeout: float) -> str:
    if isinstance(reason, TimeoutError):
        return f"{url}: timed out after {timeout:g} s"
    host = urllib.parse.urlsplit(url).netloc or url
    text = one_line(reason) if isinstance(reason, BaseException) else str(reason)
    return f"{url}: cannot reach {host}: {text}"
