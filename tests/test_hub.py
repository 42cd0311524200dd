"""bw24chat.hub against a local Hub: the REAL huggingface_hub client (HfApi, hf_hub_url,
get_hf_file_metadata) talks to a threading http.server on 127.0.0.1 that implements the Hub
endpoints it calls, with HF_ENDPOINT pointing at it and HF_HUB_DISABLE_XET=1.

The responses follow the Hub's documented API:
- Hub API endpoints, https://huggingface.co/docs/hub/en/api (reference now kept as the OpenAPI
  spec, https://huggingface.co/.well-known/openapi.json): ``GET /api/models`` takes
  ``search``, ``filter``, ``sort``, ``limit`` and answers a JSON list of models (``id``,
  ``likes``, ``downloads``, ``tags``...); ``GET /api/models/{repo_id}`` and
  ``GET /api/models/{repo_id}/revision/{revision}`` answer the model with ``sha`` and
  ``siblings`` (``rfilename``; with ``blobs=true`` also ``size``, ``blobId`` and, for LFS
  files, ``lfs: {size, sha256, pointerSize}``), as parsed by huggingface_hub's
  ``ModelInfo`` / ``RepoSibling`` (https://huggingface.co/docs/huggingface_hub/package_reference/hf_api).
- File download, https://huggingface.co/docs/huggingface_hub/guides/download and the
  ``get_hf_file_metadata`` reference
  (https://huggingface.co/docs/huggingface_hub/package_reference/file_download): ``HEAD
  /{repo_id}/resolve/{revision}/{filename}`` carries ``X-Repo-Commit`` and ``ETag``; an LFS
  file answers with a 302 to a CDN (another origin) and puts the real file's ETag and size in
  ``X-Linked-Etag`` / ``X-Linked-Size`` (the ETag of an LFS file is its SHA-256, see
  https://huggingface.co/docs/xet/file-id on resolve URLs and their redirects).  The CDN
  answers ``Range`` requests with 206 and ``Content-Range`` (RFC 9110, section 14).
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

import httpx
import pytest

from bw24chat import hub
from bw24chat.fake_engine import FakeEngine
from bw24chat.options import EngineOptions
from bw24chat.tui.app import ChatApp
from bw24chat.tui.screens.models import ModelsScreen
from tests.tui.tui_helpers import click, row_text, wait_for

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _bytes(seed: int, n: int) -> bytes:
    return hashlib.shake_256(str(seed).encode()).digest(n)


class Repo:
    def __init__(self, repo_id: str, files: dict[str, bytes], downloads: int = 0, likes: int = 0, tags=()):
        self.repo_id = repo_id
        self.files = files
        self.downloads = downloads
        self.likes = likes
        self.tags = list(tags)

    @staticmethod
    def is_lfs(name: str) -> bool:
        return name.endswith((".gguf", ".safetensors"))


class FakeHub:
    """The Hub (API + resolve) on one port and its CDN on another, like huggingface.co and
    cdn-lfs.hf.co: an LFS file's resolve URL redirects to the CDN."""

    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.log: list[tuple[str, str, dict]] = []  # (method, path, headers with lower-case names)
        self.drop_after: int | None = None  # the next CDN GET sends this many bytes, then hangs up
        self.corrupt = False  # the CDN flips a byte
        self.chunk_delay = 0.0
        hub_state = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output clean
                pass

            def do_HEAD(self):
                hub_state.handle(self, head=True)

            def do_GET(self):
                hub_state.handle(self, head=False)

        self.api = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.cdn = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        for server in (self.api, self.cdn):
            threading.Thread(target=server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.api.server_address[1]}"
        self.cdn_url = f"http://127.0.0.1:{self.cdn.server_address[1]}"

    def close(self):
        for server in (self.api, self.cdn):
            server.shutdown()
            server.server_close()

    def add(self, repo: Repo) -> Repo:
        self.repos[repo.repo_id] = repo
        return repo

    def requests(self, method: str, path_part: str) -> list[dict]:
        return [h for m, p, h in self.log if m == method and path_part in p]

    # ------------------------------------------------------------------ routing
    def handle(self, req: BaseHTTPRequestHandler, head: bool) -> None:
        url = urlparse(req.path)
        path = unquote(url.path)
        self.log.append(("HEAD" if head else "GET", req.path, {k.lower(): v for k, v in req.headers.items()}))
        query = parse_qs(url.query)
        on_cdn = req.server is self.cdn
        if on_cdn and (m := re.fullmatch(r"/lfs/([0-9a-f]{64})", path)):
            return self._serve_blob(req, head, m[1])
        if not on_cdn and path == "/api/models":
            return self._json(req, self._search(query))
        if not on_cdn and (m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)):
            return self._model_info(req, m[1], blobs="blobs" in query)
        if not on_cdn and (m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)):
            return self._resolve(req, head, m[1], m[3])
        self._error(req, 404, "Entry not found")

    def _json(self, req, payload, status=200) -> None:
        body = json.dumps(payload).encode()
        req.send_response(status)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    def _error(self, req, status: int, message: str) -> None:
        req.send_response(status)
        req.send_header("X-Error-Message", message)
        req.send_header("Content-Length", "0")
        req.end_headers()

    # ------------------------------------------------------------------ API
    def _model_summary(self, repo: Repo) -> dict:
        return {
            "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "likes": repo.likes,
            "downloads": repo.downloads,
            "private": False,
            "tags": repo.tags,
            "pipeline_tag": "text-generation",
            "library_name": "gguf" if "gguf" in repo.tags else "transformers",
            "createdAt": "2025-01-01T00:00:00.000Z",
        }

    def _search(self, query: dict) -> list[dict]:
        text = query.get("search", [""])[0].lower()
        tags = set(query.get("filter", []))
        found = [r for r in self.repos.values() if text in r.repo_id.lower() and tags <= set(r.tags)]
        if query.get("sort", [""])[0] == "downloads":
            found.sort(key=lambda r: -r.downloads)
        limit = int(query.get("limit", [1000])[0])
        return [self._model_summary(r) for r in found[:limit]]

    def _model_info(self, req, repo_id: str, blobs: bool) -> None:
        repo = self.repos.get(repo_id)
        if repo is None:
            req.send_response(401)  # what the Hub answers for a missing (or private) repo
            req.send_header("X-Error-Code", "RepoNotFound")
            req.send_header("Content-Length", "0")
            req.end_headers()
            return
        siblings = []
        for name, data in repo.files.items():
            sibling = {"rfilename": name}
            if blobs:
                sibling.update(size=len(data), blobId=hashlib.sha1(data).hexdigest())
                if Repo.is_lfs(name):
                    sibling["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
            siblings.append(sibling)
        self._json(req, {**self._model_summary(repo), "sha": COMMIT, "gated": False, "disabled": False, "siblings": siblings})

    # ------------------------------------------------------------------ files
    def _resolve(self, req, head: bool, repo_id: str, filename: str) -> None:
        repo = self.repos.get(repo_id)
        data = repo.files.get(filename) if repo else None
        if data is None:
            req.send_response(404)
            req.send_header("X-Error-Code", "EntryNotFound")
            req.send_header("Content-Length", "0")
            req.end_headers()
            return
        if Repo.is_lfs(filename):
            sha = hashlib.sha256(data).hexdigest()
            req.send_response(302)
            req.send_header("Location", f"{self.cdn_url}/lfs/{sha}?X-Amz-Signature=fake")
            req.send_header("X-Repo-Commit", COMMIT)
            req.send_header("X-Linked-Etag", f'"{sha}"')
            req.send_header("X-Linked-Size", str(len(data)))
            req.send_header("ETag", f'"{hashlib.sha1(b"pointer" + data).hexdigest()}"')
            req.send_header("Content-Length", "0")
            req.end_headers()
            return
        req.send_response(200)
        req.send_header("X-Repo-Commit", COMMIT)
        req.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        if not head:
            req.wfile.write(data)

    def _serve_blob(self, req, head: bool, sha: str) -> None:
        data = next((d for r in self.repos.values() for d in r.files.values() if hashlib.sha256(d).hexdigest() == sha), None)
        if data is None:
            return self._error(req, 404, "no such blob")
        start = 0
        range_header = req.headers.get("Range")
        if range_header and (m := re.fullmatch(r"bytes=(\d+)-", range_header)):
            start = int(m[1])
            if start >= len(data):
                req.send_response(416)
                req.send_header("Content-Range", f"bytes */{len(data)}")
                req.send_header("Content-Length", "0")
                req.end_headers()
                return
            req.send_response(206)
            req.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            req.send_response(200)
        req.send_header("Accept-Ranges", "bytes")
        req.send_header("ETag", f'"{sha}"')
        req.send_header("Content-Length", str(len(data) - start))
        req.end_headers()
        if head:
            return
        body = data[start:]
        if self.corrupt:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        limit, self.drop_after = self.drop_after, None
        sent = 0
        for offset in range(0, len(body), 64 * 1024):
            piece = body[offset : offset + 64 * 1024]
            if limit is not None and sent + len(piece) > limit:
                req.wfile.write(piece[: limit - sent])
                req.wfile.flush()
                req.close_connection = True  # hang up mid-file
                return
            req.wfile.write(piece)
            req.wfile.flush()
            sent += len(piece)
            if self.chunk_delay:
                time.sleep(self.chunk_delay)


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    server = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")  # so that we can see where it is (not) sent
    monkeypatch.setenv("BW24CHAT_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    yield server
    server.close()


TINY_Q4 = _bytes(1, 3 * 1024 * 1024 + 123)
TINY_Q8 = _bytes(2, 200_000)


@pytest.fixture
def tiny_repo(fake_hub) -> Repo:
    fake_hub.add(Repo("acme/other-model", {"model.safetensors": _bytes(9, 1000), "config.json": b"{}"}, downloads=5, tags=["safetensors"]))
    return fake_hub.add(
        Repo(
            "acme/Tiny-GGUF",
            {"README.md": b"# Tiny\n", "tiny-Q4_1.gguf": TINY_Q4, "tiny-Q8_0.gguf": TINY_Q8},
            downloads=1234,
            likes=7,
            tags=["gguf", "text-generation"],
        )
    )


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- search, files
def test_search_by_name_and_format(fake_hub, tiny_repo):
    found = hub.search_models("tiny", "gguf")
    assert [m.repo_id for m in found] == ["acme/Tiny-GGUF"]
    assert found[0].downloads == 1234 and found[0].likes == 7
    assert [m.repo_id for m in hub.search_models("acme", "safetensors")] == ["acme/other-model"]
    assert [m.repo_id for m in hub.search_models("acme")] == ["acme/Tiny-GGUF", "acme/other-model"]  # by downloads
    query = parse_qs(urlparse([p for m, p, _ in fake_hub.log if p.startswith("/api/models?")][0]).query)
    assert query["search"] == ["tiny"] and query["filter"] == ["gguf"] and query["sort"] == ["downloads"]


def test_list_choices_gives_each_quant_with_its_size(fake_hub, tiny_repo):
    files = hub.list_choices("acme/Tiny-GGUF")
    assert files.revision == COMMIT
    assert [(c.label, c.files, c.size) for c in files.choices] == [
        ("Q4_1", ["tiny-Q4_1.gguf"], len(TINY_Q4)),
        ("Q8_0", ["tiny-Q8_0.gguf"], len(TINY_Q8)),
    ]


def test_choices_group_shards_and_the_safetensors_set():
    sizes = {
        "big-Q6_K-00001-of-00002.gguf": 10,
        "big-Q6_K-00002-of-00002.gguf": 5,
        "big-Q4_K_M.gguf": 7,
        "model-00001-of-00002.safetensors": 100,
        "model-00002-of-00002.safetensors": 50,
        "model.safetensors.index.json": 1,
        "config.json": 1,
        "tokenizer.json": 2,
        "README.md": 3,
        "onnx/model.safetensors": 9,
    }
    choices = hub.choices_from_files(sizes)
    assert [(c.label, c.fmt, c.size) for c in choices] == [("Q4_K_M", "gguf", 7), ("Q6_K", "gguf", 15), ("safetensors", "safetensors", 154)]
    assert choices[1].files == ["big-Q6_K-00001-of-00002.gguf", "big-Q6_K-00002-of-00002.gguf"]
    assert choices[1].main_file == "big-Q6_K-00001-of-00002.gguf"
    assert set(choices[2].files) == {
        "config.json",
        "tokenizer.json",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    }


@pytest.mark.parametrize(
    "name, quant",
    [
        ("SmolLM2-135M-Instruct-Q4_1.gguf", "Q4_1"),
        ("qwen2.5-0.5b-instruct-q8_0.gguf", "Q8_0"),
        ("Llama-3-8B.IQ2_XXS.gguf", "IQ2_XXS"),
        ("x-Q4_K_M-00001-of-00002.gguf", "Q4_K_M"),
        ("model-bf16.gguf", "BF16"),
        ("Qwen2-7B.gguf", None),
    ],
)
def test_quant_of(name, quant):
    assert hub.quant_of(name) == quant


# ----------------------------------------------------------------------------- downloads
def test_download_reports_progress_and_checks_the_sha256(fake_hub, tiny_repo, tmp_path):
    seen = []
    path = hub.download_file("acme/Tiny-GGUF", "tiny-Q4_1.gguf", revision=COMMIT, progress=seen.append, report_every_s=0)
    assert path == hub.repo_dir("acme/Tiny-GGUF") / "tiny-Q4_1.gguf"
    assert sha256(path) == hashlib.sha256(TINY_Q4).hexdigest()
    assert not hub.part_path(path).exists()
    assert seen[-1].downloaded == seen[-1].total == len(TINY_Q4) and seen[-1].fraction == 1.0
    assert all(a.downloaded <= b.downloaded for a, b in zip(seen, seen[1:]))
    assert len(seen) > 2  # reported along the way, not only at the end
    # the metadata came from the Hub (HEAD, with the token), the bytes from the CDN (without it)
    assert fake_hub.requests("HEAD", "/acme/Tiny-GGUF/resolve/")[0]["authorization"] == "Bearer hf_test_token"
    cdn_get = fake_hub.requests("GET", "/lfs/")[0]
    assert "authorization" not in cdn_get and "range" not in cdn_get


def test_an_interrupted_download_resumes_from_the_part_file(fake_hub, tiny_repo):
    fake_hub.drop_after = 1_000_000
    with pytest.raises(httpx.TransportError):
        hub.download_file("acme/Tiny-GGUF", "tiny-Q4_1.gguf", retries=0)
    target = hub.repo_dir("acme/Tiny-GGUF") / "tiny-Q4_1.gguf"
    part = hub.part_path(target)
    assert not target.exists() and part.stat().st_size == 1_000_000

    seen = []
    hub.download_file("acme/Tiny-GGUF", "tiny-Q4_1.gguf", progress=seen.append, report_every_s=0)
    assert fake_hub.requests("GET", "/lfs/")[-1]["range"] == "bytes=1000000-"
    assert seen[0].downloaded == 1_000_000  # progress starts where the part file ended
    assert sha256(target) == hashlib.sha256(TINY_Q4).hexdigest()
    assert not part.exists()


def test_a_dropped_connection_is_retried_from_where_it_stopped(fake_hub, tiny_repo):
    fake_hub.drop_after = 500_000
    path = hub.download_file("acme/Tiny-GGUF", "tiny-Q4_1.gguf", retries=2)
    gets = fake_hub.requests("GET", "/lfs/")
    assert len(gets) == 2 and gets[1]["range"] == "bytes=500000-"
    assert sha256(path) == hashlib.sha256(TINY_Q4).hexdigest()


def test_cancel_keeps_the_part_file_and_a_later_download_resumes(fake_hub, tiny_repo):
    cancel = threading.Event()
    fake_hub.chunk_delay = 0.002

    def on_progress(p):
        if p.downloaded >= 256 * 1024:
            cancel.set()

    with pytest.raises(hub.DownloadCancelled):
        hub.download_file("acme/Tiny-GGUF", "tiny-Q4_1.gguf", progress=on_progress, cancel=cancel, report_every_s=0)
    part = hub.part_path(hub.repo_dir("acme/Tiny-GGUF") / "tiny-Q4_1.gguf")
    kept = part.stat().st_size
    assert 0 < kept < len(TINY_Q4)
    fake_hub.chunk_delay = 0.0
    path = hub.download_file("acme/Tiny-GGUF", "tiny-Q4_1.gguf")
    assert fake_hub.requests("GET", "/lfs/")[-1]["range"] == f"bytes={kept}-"
    assert sha256(path) == hashlib.sha256(TINY_Q4).hexdigest()


def test_a_part_file_of_another_version_is_not_resumed(fake_hub, tiny_repo):
    fake_hub.drop_after = 100_000
    with pytest.raises(httpx.TransportError):
        hub.download_file("acme/Tiny-GGUF", "tiny-Q8_0.gguf", retries=0)
    new_bytes = _bytes(3, 150_000)
    tiny_repo.files["tiny-Q8_0.gguf"] = new_bytes  # the file changed on the Hub meanwhile
    path = hub.download_file("acme/Tiny-GGUF", "tiny-Q8_0.gguf")
    assert "range" not in fake_hub.requests("GET", "/lfs/")[-1]
    assert path.read_bytes() == new_bytes


def test_a_corrupted_download_is_refused(fake_hub, tiny_repo):
    fake_hub.corrupt = True
    with pytest.raises(hub.DownloadError, match="checksum"):
        hub.download_file("acme/Tiny-GGUF", "tiny-Q8_0.gguf")
    target = hub.repo_dir("acme/Tiny-GGUF") / "tiny-Q8_0.gguf"
    assert not target.exists() and not hub.part_path(target).exists()


def test_a_small_non_lfs_file_downloads_from_the_hub_itself(fake_hub, tiny_repo, tmp_path):
    path = hub.download_file("acme/Tiny-GGUF", "README.md", tmp_path / "dl")
    assert path.read_bytes() == b"# Tiny\n"
    assert fake_hub.requests("GET", "/acme/Tiny-GGUF/resolve/")[0]["authorization"] == "Bearer hf_test_token"


def test_an_existing_complete_file_is_not_downloaded_again(fake_hub, tiny_repo):
    hub.download_file("acme/Tiny-GGUF", "tiny-Q8_0.gguf")
    hub.download_file("acme/Tiny-GGUF", "tiny-Q8_0.gguf")
    assert len(fake_hub.requests("GET", "/lfs/")) == 1


# ----------------------------------------------------------------------------- the model manager
def model_manager_app(opened: list | None = None) -> ChatApp:
    """The app as on a first start (no -m); ``opened`` collects the models it loads."""

    def factory(options, progress):
        if opened is not None:
            opened.append(options.model)
        return FakeEngine()

    return ChatApp(EngineOptions(), factory)


async def list_tiny_quants(pilot) -> ModelsScreen:
    """Search the Hub for "tiny" in the model manager and open the first result's quants."""
    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), what="the model manager")
    screen = app.screen
    results = screen.query_one("#hub-results")
    files = screen.query_one("#hub-files")
    await pilot.press("ctrl+f")
    # type only once the search box has the focus: keys sent earlier go to the local list
    query = screen.query_one("#hub-query")
    await wait_for(pilot, lambda: query.has_focus, what="the search box")
    await pilot.press(*"tiny", "enter")
    await wait_for(pilot, lambda: results.row_count == 1, what="search results")
    assert row_text(results, 0)[0] == "acme/Tiny-GGUF"
    await pilot.press("enter")
    await wait_for(pilot, lambda: files.row_count == 2 and files.has_focus, what="the quant list")
    assert [row_text(files, i)[0] for i in range(2)] == ["Q4_1", "Q8_0"]
    return screen


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_search_and_download_in_the_model_manager(fake_hub, tiny_repo, anyio_backend):
    opened = []
    app = model_manager_app(opened)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await list_tiny_quants(pilot)
        await pilot.press("enter")  # download Q4_1
        local = screen.query_one("#local-models")
        target = hub.repo_dir("acme/Tiny-GGUF") / "tiny-Q4_1.gguf"
        await wait_for(pilot, lambda: target.exists() and local.row_count == 1, timeout=20, what="the download")
        assert sha256(target) == hashlib.sha256(TINY_Q4).hexdigest()
        await wait_for(pilot, lambda: local.has_focus, what="the local list")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.engine is not None, what="the model to load")
        assert opened == [str(target)]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_download_can_be_cancelled_in_the_model_manager(fake_hub, tiny_repo, anyio_backend):
    fake_hub.chunk_delay = 0.05  # about 2.5 s for the file: time to press Cancel
    app = model_manager_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await list_tiny_quants(pilot)
        await pilot.press("enter")
        text = screen.query_one("#download-progress .progress-text")
        await wait_for(pilot, lambda: "MiB/s" in str(text.render()) or "KiB/s" in str(text.render()), what="progress")
        await click(pilot, "#download-cancel")
        await wait_for(pilot, lambda: "cancelled" in str(text.render()), what="the cancellation")
        part = hub.part_path(hub.repo_dir("acme/Tiny-GGUF") / "tiny-Q4_1.gguf")
        assert 0 < part.stat().st_size < len(TINY_Q4)


# ----------------------------------------------------------------------------- the default model
def test_the_default_model_comes_from_the_hub_with_progress(fake_hub, tiny_repo, monkeypatch):
    from bw24chat import model_store

    hub.hub_offline(fresh=True)
    monkeypatch.setattr(model_store, "DEFAULT_MODEL_REPO", "acme/Tiny-GGUF")
    monkeypatch.setattr(model_store, "DEFAULT_MODEL_REVISION", "main")
    monkeypatch.setattr(model_store, "DEFAULT_MODEL_FILE", "tiny-Q4_1.gguf")
    monkeypatch.setattr(model_store, "DEFAULT_MODEL_SHA256", hashlib.sha256(TINY_Q4).hexdigest())
    seen = []
    path = model_store.default_model_path(lambda text, done, total: seen.append((done, total)))
    assert path.read_bytes() == TINY_Q4
    assert seen and seen[-1] == (len(TINY_Q4), len(TINY_Q4))


def test_an_offline_hub_is_detected_once_without_retries(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE" in hub.hub_offline(fresh=True)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    t0 = time.monotonic()
    assert "not reachable" in hub.hub_offline()
    with pytest.raises(hub.HubUnreachable):
        hub.search_models("tiny")
    assert time.monotonic() - t0 < hub.HUB_PROBE_TIMEOUT_S + 1
    hub.hub_offline(fresh=True)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_failed_search_shows_why_in_place_of_the_table_with_retry(fake_hub, tiny_repo, anyio_backend, monkeypatch):
    real = hub.search_models
    calls = []

    def flaky(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise httpx.ConnectError("no route to host")
        return real(*args, **kwargs)

    monkeypatch.setattr(hub, "search_models", flaky)
    app = model_manager_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen), what="the model manager")
        screen = app.screen
        await pilot.press("ctrl+f")
        await wait_for(pilot, lambda: screen.query_one("#hub-query").has_focus, what="the search box")
        await pilot.press(*"tiny", "enter")
        error = screen.query_one("#hub-error")
        await wait_for(pilot, lambda: error.display, what="the error panel")
        assert "no route to host" in str(screen.query_one("#hub-error-text").render())
        assert not screen.query_one("#hub-results").display
        await click(pilot, "#hub-retry")
        results = screen.query_one("#hub-results")
        await wait_for(pilot, lambda: results.display and results.row_count == 1, what="results after Retry")
        assert not error.display


@pytest.mark.parametrize("name", ["../evil.gguf", "/etc/passwd", "a/../../evil.gguf", "a\\..\\evil.gguf", "C:evil.gguf", "a//b.gguf", ""])
def test_repo_file_names_cannot_leave_the_target_folder(fake_hub, tiny_repo, tmp_path, name):
    with pytest.raises(hub.UnsafeFileName):
        hub.download_files("acme/Tiny-GGUF", [name], tmp_path / "dest", revision=COMMIT)
    assert not fake_hub.requests("GET", "/")  # refused before anything was fetched


def test_a_symlink_in_the_target_folder_cannot_lead_outside(fake_hub, tiny_repo, tmp_path):
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (dest / "sub").symlink_to(outside)
    with pytest.raises(hub.UnsafeFileName):
        hub.download_files("acme/Tiny-GGUF", ["sub/tiny-Q4_1.gguf"], dest, revision=COMMIT)
    (dest / "tiny-Q4_1.gguf.part").symlink_to(outside / "stolen")
    with pytest.raises(hub.UnsafeFileName):
        hub.download_files("acme/Tiny-GGUF", ["tiny-Q4_1.gguf"], dest, revision=COMMIT)
    assert list(outside.iterdir()) == []
