"""Hugging Face Hub: search models, list a repo's downloadable choices, download with resume.

Search and repo listing go through ``huggingface_hub.HfApi``; file metadata through
``hf_hub_url`` + ``get_hf_file_metadata`` (which follow the Hub's redirects and report size
and ETag).  The bytes themselves are fetched by our own ranged GET (httpx) into a ``.part``
file so that we control progress, cancellation and resumption: an interrupted download picks
up where the ``.part`` file ends with a ``Range`` header.  A ``.part.etag`` file next to it
records which version of the file the bytes belong to, so a file changed on the Hub restarts
from zero instead of being spliced.  LFS files (the weights) have their SHA-256 as ETag; it
is checked before the file is moved into place.

The endpoint is read from ``HF_ENDPOINT`` at call time (not import time) so that a local
mirror, or a test server, can be chosen after import.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx
from huggingface_hub import HfApi, constants, get_hf_file_metadata, hf_hub_url
from huggingface_hub.utils import build_hf_headers

from .paths import models_dir

FORMATS = ("gguf", "safetensors")

# Files a safetensors model folder needs besides its weights (tokenizer, config, chat template).
_SAFETENSORS_COMPANIONS = re.compile(r"^[^/]+\.json$|^tokenizer\.model$|^merges\.txt$|^[^/]+\.jinja$")
_SHARD = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")
_QUANT = re.compile(
    r"(?:^|[-_.])(?P<q>I?Q\d+(?:_[A-Z0-9]+)*|BF16|F16|FP16|F32|FP8|MXFP4|NVFP4)(?=[-_.]|$)", re.IGNORECASE
)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


HUB_PROBE_TIMEOUT_S = 3.0


class HubUnreachable(ConnectionError):
    pass


def hub_offline(fresh: bool = False) -> str | None:
    """Why the Hugging Face hub is not to be used now, or None.  One short request per process
    (proxies honoured, no retries; ``fresh`` asks again); ``HF_HUB_OFFLINE`` skips even that.
    huggingface_hub's own calls retry a dead connection for ~20 s, printing each attempt."""
    if fresh:
        _probe.cache_clear()
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    return _probe(hub_endpoint())


@functools.cache
def _probe(endpoint: str) -> str | None:
    try:
        httpx.head(endpoint, timeout=HUB_PROBE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return f"{endpoint} is not reachable ({type(exc).__name__})"
    return None


def _online() -> None:
    why = hub_offline()
    if why is not None:
        raise HubUnreachable(why)


def _api(token: str | bool | None = None) -> HfApi:
    return HfApi(endpoint=hub_endpoint(), token=token)


def split_gguf_name(filename: str) -> tuple[str, int, int] | None:
    """(stem, index, count) of a split GGUF's part ("x-00002-of-00003.gguf"), else None."""
    m = _SHARD.match(filename)
    return (m["stem"], int(m["i"]), int(m["n"])) if m else None


def quant_of(filename: str) -> str | None:
    """The quantization named in a GGUF file name ("...-Q4_K_M.gguf" -> "Q4_K_M"), if any."""
    name = Path(filename).name
    shard = split_gguf_name(name)
    stem = shard[0] if shard else name.rsplit(".", 1)[0]
    found = None
    for m in _QUANT.finditer(stem):  # the last match wins: quant tags end the name
        found = m["q"].upper()
    return found


# ----------------------------------------------------------------------------- search
@dataclass
class HubModel:
    repo_id: str
    downloads: int = 0
    likes: int = 0
    tags: list[str] = field(default_factory=list)


def search_models(query: str, fmt: str | None = None, limit: int = 40, token: str | bool | None = None) -> list[HubModel]:
    """Models whose name matches ``query``, most downloaded first; ``fmt`` filters by tag
    ("gguf" or "safetensors")."""
    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}")
    _online()
    models = _api(token).list_models(search=query or None, filter=fmt, sort="downloads", limit=limit)
    return [HubModel(m.id, m.downloads or 0, m.likes or 0, list(m.tags or [])) for m in models]


# ----------------------------------------------------------------------------- choices
@dataclass
class DownloadChoice:
    """One thing to download from a repo: a GGUF quant (maybe in shards) or the safetensors set."""

    label: str
    fmt: str
    files: list[str]
    size: int  # bytes, 0 when the Hub did not say

    @property
    def main_file(self) -> str:
        """The file to open once downloaded (the first shard, or "" for a folder model)."""
        return self.files[0] if self.fmt == "gguf" else ""


@dataclass
class RepoFiles:
    repo_id: str
    revision: str  # the commit the listing came from: downloads pin it
    choices: list[DownloadChoice]


def list_choices(repo_id: str, revision: str | None = None, token: str | bool | None = None) -> RepoFiles:
    _online()
    info = _api(token).model_info(repo_id, revision=revision, files_metadata=True)
    sizes = {s.rfilename: (s.size or (s.lfs.size if s.lfs else 0) or 0) for s in info.siblings or []}
    return RepoFiles(repo_id, info.sha or revision or "main", choices_from_files(sizes))


def choices_from_files(sizes: dict[str, int]) -> list[DownloadChoice]:
    """Group a repo's files (name -> size) into download choices."""
    gguf_groups: dict[str, list[str]] = {}
    for name in sorted(sizes):
        if name.endswith(".gguf"):
            shard = split_gguf_name(name)
            gguf_groups.setdefault(shard[0] if shard else name, []).append(name)
    choices = [
        DownloadChoice(quant_of(files[0]) or Path(files[0]).name, "gguf", files, sum(sizes[f] for f in files))
        for files in gguf_groups.values()
    ]
    weights = [n for n in sorted(sizes) if n.endswith(".safetensors") and "/" not in n]
    if weights:
        files = [n for n in sorted(sizes) if _SAFETENSORS_COMPANIONS.match(n)] + weights
        choices.append(DownloadChoice("safetensors", "safetensors", files, sum(sizes[f] for f in files)))
    return choices


# ----------------------------------------------------------------------------- download
class DownloadCancelled(Exception):
    """The cancel event was set; the ``.part`` file is kept for a later resume."""


class DownloadError(Exception):
    pass


@dataclass
class DownloadProgress:
    filename: str  # the file being fetched now
    downloaded: int  # bytes, over every file of the download
    total: int | None
    speed: float  # bytes per second, over the last few seconds
    files_done: int = 0
    files_total: int = 1

    @property
    def fraction(self) -> float | None:
        return self.downloaded / self.total if self.total else None

    @property
    def eta_s(self) -> float | None:
        if not self.total or self.speed <= 0:
            return None
        return max(self.total - self.downloaded, 0) / self.speed


class _SpeedMeter:
    """Bytes per second over a sliding window (a plain average would hide a stall)."""

    def __init__(self, window_s: float = 3.0):
        self.window_s = window_s
        self._samples: list[tuple[float, int]] = []

    def add(self, total_bytes: int) -> float:
        now = time.monotonic()
        self._samples.append((now, total_bytes))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window_s:
            self._samples.pop(0)
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0


def repo_dir(repo_id: str) -> Path:
    """Where a repo's downloads go: ``models_dir()/owner--name``."""
    return models_dir() / repo_id.replace("/", "--")


@dataclass
class _RemoteFile:
    name: str
    url: str  # where the bytes are (after the Hub's redirects)
    size: int | None
    etag: str | None


def download_files(
    repo_id: str,
    filenames: list[str],
    dest_dir: Path | None = None,
    *,
    revision: str = "main",
    progress: Callable[[DownloadProgress], None] | None = None,
    cancel: threading.Event | None = None,
    retries: int = 3,
    token: str | bool | None = None,
    report_every_s: float = 0.1,
) -> list[Path]:
    """Download ``filenames`` of ``repo_id`` into ``dest_dir`` (default :func:`repo_dir`),
    resuming any ``.part`` files left by an earlier attempt.

    A dropped connection is retried ``retries`` times, each from where the bytes stopped.
    Raises :class:`DownloadCancelled` when ``cancel`` is set, :class:`DownloadError` on a
    size or checksum mismatch, and the transport error once the retries are spent.
    """
    dest_dir = Path(dest_dir) if dest_dir is not None else repo_dir(repo_id)
    _online()
    targets = [safe_target(dest_dir, name) for name in filenames]  # all checked before any byte is fetched
    cancel = cancel or threading.Event()
    headers = build_hf_headers(token=token)
    remotes = []
    for name in filenames:
        meta = get_hf_file_metadata(hf_hub_url(repo_id, name, revision=revision, endpoint=hub_endpoint()), token=token)
        remotes.append(_RemoteFile(name, meta.location, meta.size, meta.etag))
    sizes = [r.size for r in remotes]
    total = sum(sizes) if None not in sizes else None
    done_bytes = 0
    meter = _SpeedMeter()
    last_report = 0.0

    def report(name: str, file_bytes: int, files_done: int, force: bool = False) -> None:
        nonlocal last_report
        now = time.monotonic()
        if progress is None or (not force and now - last_report < report_every_s):
            return
        last_report = now
        downloaded = done_bytes + file_bytes
        progress(DownloadProgress(name, downloaded, total, meter.add(downloaded), files_done, len(remotes)))

    paths = []
    with httpx.Client(follow_redirects=True, timeout=httpx.Timeout(30.0, read=60.0)) as client:
        for index, (remote, target) in enumerate(zip(remotes, targets)):
            # large files are served by a CDN through a signed URL: the token stays on the Hub
            file_headers = headers if _same_origin(remote.url, hub_endpoint()) else _without_auth(headers)
            _fetch(client, remote, target, file_headers, cancel, retries, lambda n, i=index, r=remote: report(r.name, n, i))
            done_bytes += target.stat().st_size
            report(remote.name, 0, index + 1, force=True)
            paths.append(target)
    return paths


class UnsafeFileName(DownloadError):
    pass


def safe_target(dest_dir: Path, name: str) -> Path:
    """Where repo file ``name`` may be written: inside ``dest_dir`` and nowhere else.  Names come
    from the server (a mirror set by HF_ENDPOINT is as trusted as its operator): absolute paths,
    "..", backslashes and drive letters are refused, and so is a name that a symlink already in
    the folder would lead outside it."""
    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or ":" in name or any(p in ("", ".", "..") for p in parts):
        raise UnsafeFileName(f"refusing the repo file name {name!r}: it would be written outside {dest_dir}")
    target = dest_dir.joinpath(*parts)
    root = dest_dir.resolve()
    if not target.resolve().is_relative_to(root) or not part_path(target).resolve().is_relative_to(root):
        raise UnsafeFileName(f"refusing {name!r}: a symlink in {dest_dir} leads outside it")
    return target


def _same_origin(a: str, b: str) -> bool:
    ua, ub = httpx.URL(a), httpx.URL(b)
    return (ua.scheme, ua.host, ua.port) == (ub.scheme, ub.host, ub.port)


def _without_auth(headers: dict) -> dict:
    return {k: v for k, v in headers.items() if k.lower() != "authorization"}


def download_file(repo_id: str, filename: str, dest_dir: Path | None = None, **kwargs) -> Path:
    """:func:`download_files` for one file."""
    return download_files(repo_id, [filename], dest_dir, **kwargs)[0]


def part_path(target: Path) -> Path:
    return target.with_name(target.name + ".part")


def _fetch(
    client: httpx.Client,
    remote: _RemoteFile,
    target: Path,
    headers: dict,
    cancel: threading.Event,
    retries: int,
    on_bytes: Callable[[int], None],
) -> None:
    if target.exists() and remote.size is not None and target.stat().st_size == remote.size:
        return  # already downloaded (a finished file is only ever moved into place whole)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = part_path(target)
    etag_file = part.with_name(part.name + ".etag")
    if part.exists() and (not etag_file.exists() or etag_file.read_text() != (remote.etag or "")):
        part.unlink()  # bytes of another version of the file: start over
    etag_file.write_text(remote.etag or "")

    attempts = 0
    while True:
        try:
            _fetch_once(client, remote, part, headers, cancel, on_bytes)
            break
        except httpx.TransportError:  # a dropped connection (a short read included)
            attempts += 1
            if attempts > retries:
                raise
            time.sleep(min(0.2 * 2**attempts, 5.0))

    _verify(part, remote)
    os.replace(part, target)
    etag_file.unlink(missing_ok=True)


class _ShortRead(httpx.TransportError):
    def __init__(self, got: int, expected: int):
        super().__init__(f"the connection ended after {got} of {expected} bytes")


def _fetch_once(
    client: httpx.Client,
    remote: _RemoteFile,
    part: Path,
    headers: dict,
    cancel: threading.Event,
    on_bytes: Callable[[int], None],
) -> None:
    offset = part.stat().st_size if part.exists() else 0
    if remote.size is not None and offset >= remote.size:
        if offset > remote.size:
            part.unlink()  # longer than the file: not ours
            offset = 0
        else:
            return
    request_headers = {**headers, "Accept-Encoding": "identity"}
    if offset:
        request_headers["Range"] = f"bytes={offset}-"
    with client.stream("GET", remote.url, headers=request_headers) as response:
        if response.status_code == 416 and remote.size == offset:
            return
        response.raise_for_status()
        if offset and response.status_code != 206:
            offset = 0  # the server ignored the Range header and sends the whole file
        elif offset and not _range_starts_at(response, offset):
            raise DownloadError(f"{remote.name}: the server sent another range than the one asked for")
        with open(part, "ab" if offset else "wb") as f:
            written = offset
            on_bytes(written)
            for chunk in response.iter_bytes():
                if cancel.is_set():
                    raise DownloadCancelled(remote.name)
                f.write(chunk)
                written += len(chunk)
                on_bytes(written)
    if remote.size is not None and written < remote.size:
        raise _ShortRead(written, remote.size)


def _range_starts_at(response: httpx.Response, offset: int) -> bool:
    m = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
    return m is not None and int(m[1]) == offset


def _verify(part: Path, remote: _RemoteFile) -> None:
    size = part.stat().st_size
    if remote.size is not None and size != remote.size:
        part.unlink()
        raise DownloadError(f"{remote.name}: got {size} bytes, expected {remote.size}")
    if remote.etag and _SHA256.match(remote.etag):  # LFS files: the ETag is the content's SHA-256
        digest = hashlib.sha256()
        with open(part, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        if digest.hexdigest() != remote.etag:
            part.unlink()
            raise DownloadError(f"{remote.name}: checksum mismatch (the download was corrupted; try again)")
