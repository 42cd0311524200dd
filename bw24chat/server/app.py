"""bw24chat's OpenAI-compatible HTTP server (``bw24chat serve``).

Why Starlette + uvicorn: a small, well-kept ASGI stack with native streaming responses (SSE is
an async generator handed to ``StreamingResponse``), client-disconnect detection built in, and
no heavy framework (no pydantic models, no dependency injection): request bodies are checked by
hand in :mod:`.protocol`, which keeps OpenAI's exact error shape under our control.

Endpoints
    ``GET /health``, ``GET /metrics`` (Prometheus text), ``GET /v1/models``,
    ``GET /v1/models/{id}``, ``POST /v1/chat/completions``, ``POST /v1/completions``
    (streaming as SSE ``data: {json}`` chunks ending with ``data: [DONE]``, or whole).

Policies
    * Model names: one model is served, under a clean id (``--model-name``, else the repo id or
      the GGUF file stem); a request may name it by that id or an alias (the friendly name, the
      file name, what ``-m`` said, e.g. ``default``).  Any other ``model`` gets 404
      ``model_not_found``, as OpenAI answers; ``/v1/models`` lists only the id.
    * Auth: with an API key, every endpoint but ``GET /health`` needs
      ``Authorization: Bearer KEY`` (401 otherwise); ``/metrics`` is protected too.
    * Limits: bodies over ``max_body_bytes`` get 413; ``max_tokens`` over ``max_tokens_cap``
      gets 400 (an omitted ``max_tokens`` is the engine default, capped); a prompt that fills
      the context gets 400 ``context_length_exceeded``; a full engine queue gets 429 with
      ``Retry-After``.  The server binds 127.0.0.1 unless told otherwise.
    * Concurrency: a batching engine (the NumPy backend) decodes concurrent requests together
      (scheduler.py; each one's tokens are what it gets alone), others serve one request at a
      time from a FIFO queue; every choice of an HTTP request has its own
      :class:`~bw24chat.api.RequestHandle`, whose events are hopped onto the event loop through
      the request's private ``asyncio.Queue``, so streams never mix.  ``n`` > 1 submits one
      engine request per choice.  A client that
      disconnects (streaming or not) cancels its generation at the next decode step.
    * Errors are OpenAI-shaped: ``{"error": {"message", "type", "param", "code"}}``; an engine
      failure mid-stream arrives as a ``data: {"error": ...}`` chunk.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import hmac
import ipaddress
import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from .. import __version__
from ..api import (
    DoneEvent,
    EngineAPI,
    EngineBusy,
    EngineClosed,
    ErrorEvent,
    GenerationRequest,
    SamplingParams,
    TokenEvent,
)
from ..console import load_reporter
from ..options import EngineOptions, add_engine_args, options_from_args, parser
from ..sampling_defaults import effective_sampling
from .metrics import Metrics
from .protocol import APIError, Limits, ParsedRequest, Responder, check_model, parse_chat, parse_completion, sse

log = logging.getLogger("bw24chat.server")

DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_MAX_TOKENS_CAP = 4096
DRAIN_MAX_BYTES = 64 << 20  # a too-large body up to this size is read (and dropped) before the 413
HEAD_TIMEOUT_S = 10.0  # a request line and headers must arrive within this (slowloris clients)
BODY_TIMEOUT_S = 30.0  # and the body within this once they have
MAX_HEADER_BYTES = 32 << 10
MAX_HEADERS = 100
OPEN_PATHS = {"/health"}
ENDPOINTS = {"/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions"}


# ----------------------------------------------------------------------------- plumbing
def _error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _endpoint_label(path: str) -> str:
    if path in ENDPOINTS:
        return path
    return "/v1/models/{id}" if path.startswith("/v1/models/") else "other"


class _FrontDoor:
    """ASGI middleware: API-key check and per-endpoint/status request counting."""

    def __init__(self, app, metrics: Metrics, api_key: str | None):
        self.app = app
        self.metrics = metrics
        self.api_key = api_key.encode() if api_key else None

    def _authorized(self, scope) -> bool:
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key)
        return False

    @staticmethod
    def _oversized_headers(scope) -> bool:
        headers = scope.get("headers", [])
        return len(headers) > MAX_HEADERS or sum(len(n) + len(v) for n, v in headers) > MAX_HEADER_BYTES

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_recording(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.http_started()
        try:
            if self._oversized_headers(scope):
                err = APIError(431, f"The request headers are larger than this server's limit ({MAX_HEADERS} headers, "
                                    f"{MAX_HEADER_BYTES} bytes).", code="headers_too_large")
                await _error_response(err)(scope, receive, send_recording)
            elif self.api_key and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
                err = APIError(401, "Missing or wrong API key: send 'Authorization: Bearer KEY'.",
                               code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                await _error_response(err)(scope, receive, send_recording)
            else:
                await self.app(scope, receive, send_recording)
        finally:
            self.metrics.http_finished(_endpoint_label(scope["path"]), status)


async def _read_json(request: Request, limit: int) -> dict:
    too_big = APIError(413, f"The request body is larger than this server's limit of {limit} bytes.",
                       code="request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > DRAIN_MAX_BYTES:
        raise too_big
    chunks, size = [], 0
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            async for chunk in request.stream():
                size += len(chunk)
                if size > DRAIN_MAX_BYTES:
                    break
                if size <= limit:
                    chunks.append(chunk)
    except ClientDisconnect:
        raise APIError(499, "The client closed the connection.", code="client_closed") from None
    except TimeoutError:
        raise APIError(408, f"The request body did not arrive within {BODY_TIMEOUT_S:g} s.", code="request_timeout",
                       headers={"Connection": "close"}) from None
    if size > limit:
        raise too_big  # the body was drained first, so that the client reads the answer
    try:
        data = json.loads(b"".join(chunks))
    except ValueError as exc:
        raise APIError(400, f"We could not parse the JSON body of your request: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_json")
    return data


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _Inbox:
    """Engine events hopped onto the event loop in batches.  The engine thread appends and asks
    for one wake-up (``call_soon_threadsafe``: a write to the loop's self-pipe) only when none is
    pending, so a step's events for every stream, or several steps' while the loop is busy, cross
    in one hop.  ``armed`` is cleared before the queue is drained, so an event appended after the
    drain finds it clear and arms a new wake-up: none is ever left behind."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.items: collections.deque = collections.deque()
        self.armed = False

    def put(self, target: "_Generation", i: int, ev) -> None:  # engine thread
        self.items.append((target, i, ev))
        if not self.armed:
            self.armed = True
            try:
                self.loop.call_soon_threadsafe(self._deliver)
            except RuntimeError:  # the loop is gone (server shut down): nobody is listening
                pass

    def _deliver(self) -> None:  # event loop
        self.armed = False
        items = self.items
        touched = set()
        while items:
            target, i, ev = items.popleft()
            target.ready.append((i, ev))
            touched.add(target)
        for target in touched:
            target.wake()


class _Generation:
    """A request's submitted choices (one engine request each), whose engine events arrive on the
    event loop as (choice index, event), each choice's in order, in batches of those ready."""

    def __init__(self, engine: EngineAPI, requests: list[GenerationRequest], metrics: Metrics, inbox: _Inbox):
        self.ready: list = []  # (index, event) arrived, not yet taken
        self._waiter: asyncio.Future | None = None
        self.n = len(requests)
        self.handles = []
        t0 = time.monotonic()

        def on_event(i, ev):  # engine thread
            if not isinstance(ev, TokenEvent):  # tokens are counted from the DoneEvent's usage
                metrics.observe(ev, time.monotonic() - t0)
            inbox.put(self, i, ev)

        try:
            for i, r in enumerate(requests):
                self.handles.append(engine.submit(r, on_event=lambda ev, i=i: on_event(i, ev)))
        except BaseException:
            self.cancel()  # the choices already submitted
            raise

    def wake(self) -> None:  # event loop (_Inbox)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def batches(self):
        """Lists of (index, event), as they arrive, until every choice has its DoneEvent or
        ErrorEvent."""
        left = self.n
        while left:
            while not self.ready:
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
            batch, self.ready = self.ready, []
            left -= sum(1 for _, ev in batch if isinstance(ev, (DoneEvent, ErrorEvent)))
            yield batch

    def cancel(self) -> None:
        for h in self.handles:
            if not h.done:
                h.cancel()


# ----------------------------------------------------------------------------- the app
class _Service:
    def __init__(self, engine: EngineAPI, max_body_bytes: int, limits: Limits, model_name: str):
        info = engine.info
        limits.model_id = model_name
        limits.models = frozenset({model_name, info.model_id, info.name, *info.aliases})
        limits.vocab_size = info.vocab_size
        self.engine = engine
        self.max_body = max_body_bytes
        self.limits = limits
        self.model_name = model_name
        self.fingerprint = f"bw24chat-{__version__}-{engine.info.backend}"
        self.metrics = Metrics()
        self._inbox: _Inbox | None = None  # made on the serving loop, at the first request

    # -- small endpoints
    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self.model_name, "queue_depth": self.engine.queue_depth()})

    async def metrics_text(self, request: Request) -> Response:
        stats = await anyio.to_thread.run_sync(self.engine.stats)
        text = self.metrics.render(self.engine.info, self.model_name, self.engine.queue_depth(), stats)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    def _model_card(self) -> dict:
        info = self.engine.info
        return {"id": self.model_name, "object": "model", "created": int(self.metrics.started),
                "owned_by": "bw24chat", "max_model_len": info.n_ctx, "backend": info.backend}

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        check_model(request.path_params["model_id"], self.limits)
        return JSONResponse(self._model_card())

    # -- generation
    async def chat(self, request: Request) -> Response:
        return await self._generate(request, parse_chat)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, parse_completion)

    def _prompt_tokens(self, g: GenerationRequest) -> int:
        """The prompt's tokens, its messages rendered first (a worker thread: a long prompt's
        template and tokenizer stay off the event loop, in one hop)."""
        if g.prompt_ids is not None:
            return len(g.prompt_ids)
        text = g.prompt
        if text is None:
            try:
                text = self.engine.render_prompt(g.messages, g.add_generation_prompt)
            except Exception as exc:  # noqa: BLE001 - a template that rejects these messages
                raise APIError(400, f"The messages do not fit the model's chat template: {exc}", "messages",
                               "invalid_value") from None
        return self.engine.count_tokens(text)

    async def _check_context(self, parsed: ParsedRequest) -> None:
        n = await anyio.to_thread.run_sync(self._prompt_tokens, parsed.generation)
        n_ctx = self.engine.info.n_ctx
        if n_ctx and n >= n_ctx:
            raise APIError(400, f"This model's maximum context length is {n_ctx} tokens, but the "
                                f"{parsed.prompt_param} take {n} tokens.", parsed.prompt_param, "context_length_exceeded")

    def _submit(self, parsed: ParsedRequest) -> _Generation:
        loop = asyncio.get_running_loop()
        if self._inbox is None or self._inbox.loop is not loop:
            self._inbox = _Inbox(loop)
        try:
            return _Generation(self.engine, parsed.choices(), self.metrics, self._inbox)
        except EngineBusy as exc:
            wait = self.metrics.retry_after_s()
            raise APIError(429, f"The server is busy ({exc}); retry in {wait} s.", code="queue_full",
                           headers={"Retry-After": str(wait)}) from None
        except EngineClosed:
            raise APIError(503, "The engine is shutting down.", code="engine_closed") from None

    async def _generate(self, request: Request, parse) -> Response:
        parsed = parse(await _read_json(request, self.max_body), self.limits)
        await self._check_context(parsed)
        gen = self._submit(parsed)
        responder = Responder(parsed, self.model_name, self.fingerprint)
        if parsed.stream:
            # the background task also cancels a stream whose client left before it started
            return StreamingResponse(self._stream(responder, gen), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                                     background=BackgroundTask(gen.cancel))
        work = asyncio.ensure_future(self._collect(responder, gen))
        gone = asyncio.ensure_future(_wait_disconnect(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():
                work.cancel()
                gen.cancel()
        if not work.done():
            raise APIError(499, "The client closed the connection.", code="client_closed")
        return JSONResponse(work.result())

    @staticmethod
    async def _collect(responder: Responder, gen: _Generation) -> dict:
        parts = [[] for _ in range(gen.n)]
        lps = [[] for _ in range(gen.n)]
        dones = [None] * gen.n
        async for batch in gen.batches():
            for i, ev in batch:
                if isinstance(ev, TokenEvent):
                    parts[i].append(ev.text)
                    if ev.logprobs:
                        lps[i].extend(ev.logprobs)
                elif isinstance(ev, DoneEvent):
                    dones[i] = ev
                elif isinstance(ev, ErrorEvent):
                    gen.cancel()
                    raise APIError(500, f"The generation failed: {ev.message}", code="generation_failed")
        return responder.body(["".join(p) for p in parts], lps, dones)

    @staticmethod
    async def _stream(responder: Responder, gen: _Generation):
        # Starlette cancels this generator when the client disconnects: the finally cancels the
        # generation (a no-op once it has finished).  The events that arrived together go out in
        # one write: a chunk each, as SSE frames them, but one trip through Starlette, uvicorn
        # and the socket.
        try:
            opening = responder.opening_chunks()
            if opening:  # at once: the client sees the stream open before the first token
                yield b"".join(sse(chunk) for chunk in opening)
            out, dones = [], []
            async for batch in gen.batches():
                for i, ev in batch:
                    if isinstance(ev, TokenEvent):
                        if ev.logprobs:
                            out.append(sse(responder.piece_chunk(ev.text, ev.logprobs, i)))
                        elif ev.text:
                            out.append(responder.piece_sse(ev.text, i))
                    elif isinstance(ev, DoneEvent):
                        dones.append((i, ev))
                        out.append(sse(responder.finish_chunk(ev, i)))
                    elif isinstance(ev, ErrorEvent):
                        out.append(sse(APIError(500, f"The generation failed: {ev.message}", code="generation_failed").body()))
                if out:
                    yield b"".join(out)
                    out = []
            if len(dones) == gen.n:
                out.extend(sse(chunk) for chunk in responder.usage_chunks([d for _, d in sorted(dones, key=lambda x: x[0])]))
            out.append(sse("[DONE]"))
            yield b"".join(out)
        finally:
            gen.cancel()


async def _on_api_error(request: Request, exc: APIError) -> Response:
    return _error_response(exc)


async def _on_http_error(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        message = f"Invalid URL ({request.method} {request.url.path})."
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed on {request.url.path}."
    else:
        message = str(exc.detail)
    return _error_response(APIError(exc.status_code, message, headers=dict(exc.headers or {})))


async def _on_crash(request: Request, exc: Exception) -> Response:
    log.exception("internal error answering %s %s", request.method, request.url.path)
    return _error_response(APIError(500, f"Internal server error: {type(exc).__name__}.", type="server_error"))


def create_app(
    engine: EngineAPI,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_tokens_cap: int = DEFAULT_MAX_TOKENS_CAP,
    model_name: str | None = None,
    defaults: SamplingParams | None = None,
) -> Starlette:
    """The ASGI app serving ``engine``.  ``defaults`` fill sampling parameters a request leaves
    out (the engine flags); ``model_name`` is the id reported (default: the engine's model name).
    ``app.state.metrics`` holds the counters."""
    svc = _Service(engine, max_body_bytes, Limits(max_tokens_cap, defaults or SamplingParams()),
                   model_name or engine.info.model_id)
    app = Starlette(
        routes=[
            Route("/health", svc.health, methods=["GET"]),
            Route("/metrics", svc.metrics_text, methods=["GET"]),
            Route("/v1/models", svc.models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", svc.model, methods=["GET"]),
            Route("/v1/chat/completions", svc.chat, methods=["POST"]),
            Route("/v1/completions", svc.completions, methods=["POST"]),
        ],
        middleware=[Middleware(_FrontDoor, metrics=svc.metrics, api_key=api_key)],
        exception_handlers={APIError: _on_api_error, HTTPException: _on_http_error, Exception: _on_crash},
    )
    app.state.metrics = svc.metrics
    app.state.model_name = svc.model_name
    return app


# ----------------------------------------------------------------------------- running it
def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto named: asyncio sets TCP_NODELAY only on connections whose socket says IPPROTO_TCP
    # (base_events._set_nodelay), and accepted ones inherit it; with proto 0, Nagle held every
    # response's body behind the client's delayed ACK of its headers (~40 ms a request)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _url(host: str, sock: socket.socket) -> str:
    port = sock.getsockname()[1]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _HeadDeadline(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose next request line and headers have not
    arrived ``HEAD_TIMEOUT_S`` after it opened or after its last response (uvicorn has a keep-alive
    timeout, but the first byte of a request cancels it, so a slowloris client holds its
    connection for ever)."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm_head_deadline()

    def _arm_head_deadline(self) -> None:
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_overdue, self.cycle)

    def _head_overdue(self, cycle_then) -> None:
        idle = self.cycle is None or self.cycle.response_complete  # no request in progress
        if self.cycle is cycle_then and idle and not self.transport.is_closing():
            self.transport.close()

    def on_response_complete(self) -> None:
        self._head_timer.cancel()
        self._arm_head_deadline()
        super().on_response_complete()

    def connection_lost(self, exc) -> None:
        self._head_timer.cancel()
        super().connection_lost(exc)


def _uvicorn_server(app, log_level: str, quiet: bool) -> uvicorn.Server:
    extra = {"log_config": None, "access_log": False} if quiet else {}
    config = uvicorn.Config(app, log_level=log_level, lifespan="off", timeout_graceful_shutdown=5, http=_HeadDeadline,
                            h11_max_incomplete_event_size=MAX_HEADER_BYTES, **extra)
    return uvicorn.Server(config)


def serve(
    options: EngineOptions,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    engine: EngineAPI | None = None,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_tokens_cap: int = DEFAULT_MAX_TOKENS_CAP,
    model_name: str | None = None,
    port_file: str | None = None,
    log_level: str = "info",
) -> int:
    """Serve until interrupted; returns the exit status.  The port is bound first (so a busy
    port fails before a model loads), then the engine is opened (unless given; an engine opened
    here is closed at the end), then uvicorn runs.  ``port=0`` takes any free port: the URL is
    printed to stderr and, with ``port_file``, the port number is written there."""
    try:
        sock = _bind(host, port)
    except OSError as exc:
        print(f"bw24chat serve: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    own = engine is None
    try:
        if own:
            from ..engine import open_engine

            engine = open_engine(options, progress=load_reporter("bw24chat serve"))
        defaults = effective_sampling(options.sampling, options.sampling_set, engine.info.sampling_defaults)
        app = create_app(engine, api_key, max_body_bytes, max_tokens_cap, model_name, defaults)
        server = _uvicorn_server(app, log_level, quiet=False)
        url = _url(host, sock)
        print(f"bw24chat: serving {app.state.model_name} at {url}/v1 (OpenAI-compatible)", file=sys.stderr, flush=True)
        if not _is_loopback(host) and not api_key:
            print("bw24chat: WARNING: listening beyond this machine without --api-key", file=sys.stderr, flush=True)
        if port_file:
            tmp = Path(port_file + ".tmp")
            tmp.write_text(str(sock.getsockname()[1]))
            tmp.replace(port_file)
        server.run(sockets=[sock])
        return 0 if server.started else 1
    except KeyboardInterrupt:
        return 0
    finally:
        sock.close()
        if own and engine is not None:
            engine.close()


def start_in_thread(
    engine: EngineAPI,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
    *,
    ready_timeout: float = 10.0,
    **app_options,
) -> tuple[uvicorn.Server, threading.Thread]:
    """Serve ``engine`` from a daemon thread of this process (e.g. next to the TUI), quietly
    (no uvicorn logging set-up, no access log; signals are left alone off the main thread).
    Returns once the server accepts connections; ``server.url`` is its base URL.  Stop it with
    ``server.should_exit = True; thread.join()``.  ``app_options`` go to :func:`create_app`."""
    sock = _bind(host, port)
    server = _uvicorn_server(create_app(engine, api_key=api_key, **app_options), "warning", quiet=True)
    server.url = _url(host, sock)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="bw24chat-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + ready_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"the server at {server.url} did not start")
        time.sleep(0.01)
    return server, thread


# ----------------------------------------------------------------------------- the CLI
def add_serve_args(p: argparse.ArgumentParser) -> None:
    """The server's own flags (the engine flags come from ``options.add_engine_args``)."""
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    g.add_argument("--port", type=int, default=8000, help="TCP port (0: any free port)")
    g.add_argument("--api-key", default=os.environ.get("BW24CHAT_API_KEY") or None,
                   help="require 'Authorization: Bearer KEY' (default: $BW24CHAT_API_KEY; /health stays open)")
    g.add_argument("--max-body", type=int, default=DEFAULT_MAX_BODY_BYTES, help="largest request body in bytes (413 above)")
    g.add_argument("--max-tokens-cap", type=int, default=DEFAULT_MAX_TOKENS_CAP, help="largest max_tokens a request may ask")
    g.add_argument("--max-queue", type=int, default=64, help="requests waiting at most (429 with Retry-After above)")
    g.add_argument("--model-name", default=None, help="model id reported to clients (default: the repo id or the GGUF file stem)")
    g.add_argument("--port-file", default=None, help="write the bound port number to this file once listening")
    g.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level")
    t = p.add_argument_group("testing")
    t.add_argument("--fake", action="store_true", help="serve the scripted fake engine instead of a model")
    t.add_argument("--fake-token-delay", type=float, default=0.005, help="seconds per fake token")
    t.add_argument("--fake-echo", action="store_true", help="the fake engine replies 'You said: <prompt>'")


def _echo_reply(request: GenerationRequest) -> str:
    if request.prompt is not None:
        return f"You said: {request.prompt}"
    if request.prompt_ids is not None:
        return f"You said: {' '.join(map(str, request.prompt_ids))}"
    users = [m["content"] for m in request.messages or [] if m["role"] == "user"]
    return f"You said: {users[-1] if users else ''}"


def build_parser(prog: str = "bw24chat serve") -> argparse.ArgumentParser:
    p = parser(prog, "OpenAI-compatible HTTP server")
    add_engine_args(p)
    add_serve_args(p)
    return p


def main(argv: list[str], prog: str = "bw24chat serve") -> int:
    return serve_from_args(build_parser(prog).parse_args(argv))


def serve_from_args(args: argparse.Namespace) -> int:
    """``bw24chat serve``: the engine flags plus :func:`add_serve_args`'s, parsed."""
    options = options_from_args(args)
    options.max_queue = args.max_queue
    engine = None
    if args.fake:
        from ..fake_engine import FakeEngine

        engine = FakeEngine(replies=_echo_reply if args.fake_echo else None, token_delay=args.fake_token_delay,
                            max_queue=args.max_queue, spec=options.spec, spec_k=options.spec_k)
    try:
        return serve(options, args.host, args.port, args.api_key, engine, max_body_bytes=args.max_body,
                     max_tokens_cap=args.max_tokens_cap, model_name=args.model_name, port_file=args.port_file,
                     log_level=args.log_level)
    finally:
        if engine is not None:
            engine.close()
