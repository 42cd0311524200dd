"""The worker thread that every engine (real or fake) runs its requests on.

Requests are served first come, first served from a bounded queue (``EngineBusy`` when full).
One request runs at a time; a request whose handle is cancelled before it starts ends at once
with ``finish_reason="cancelled"``.  Batched decoding of concurrent requests would replace
``_serve_one`` with a step loop over several handles; the handle API stays the same.
"""
from __future__ import annotations

import queue
import threading
import traceback
from typing import Callable

from .api import DoneEvent, EngineBusy, EngineClosed, ErrorEvent, Event, GenerationRequest, RequestHandle, Usage


class EngineThread:
    def __init__(self, max_queue: int = 64, name: str = "bw24chat-engine"):
        self._requests: queue.Queue[RequestHandle | None] = queue.Queue(maxsize=max_queue)
        self._closed = False
        self._busy = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # -- to be provided by the engine
    def run_request(self, handle: RequestHandle) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- client API
    def submit(self, request: GenerationRequest, on_event: Callable[[Event], None] | None = None) -> RequestHandle:
        if self._closed:
            raise EngineClosed("the engine is closed")
        handle = RequestHandle(request, on_event)
        try:
            self._requests.put_nowait(handle)
        except queue.Full:
            raise EngineBusy(f"{self._requests.maxsize} requests are already waiting") from None
        return handle

    def queue_depth(self) -> int:
        """Requests waiting plus the one running."""
        return self._requests.qsize() + (1 if self._busy.is_set() else 0)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # drain waiting requests so their clients are not left hanging
        while True:
            try:
                h = self._requests.get_nowait()
            except queue.Empty:
                break
            if h is not None:
                h.emit(ErrorEvent("the engine was closed"))
        self._requests.put(None)
        self._thread.join(timeout=30)

    # -- worker
    def _loop(self) -> None:
        while True:
            handle = self._requests.get()
            if handle is None:
                return
            self._busy.set()
            try:
                if handle.cancelled:
                    handle.emit(DoneEvent("cancelled", Usage(0, 0)))
                else:
                    self.run_request(handle)
                if not handle.done:  # a run_request that forgot to finish is a bug: surface it
                    handle.emit(ErrorEvent("internal error: the request ended without a final event"))
            except Exception as exc:  # noqa: BLE001 - every failure must reach the client
                traceback.print_exc()
                if not handle.done:
                    handle.emit(ErrorEvent(f"{type(exc).__name__}: {exc}"))
            finally:
                self._busy.clear()
