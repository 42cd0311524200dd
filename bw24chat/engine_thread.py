"""The worker thread that every engine (real or fake) runs its requests on.

Requests wait in a bounded queue (``EngineBusy`` when ``max_queue`` are waiting; an interactive
request, the TUI's, is never refused for server load).  A request whose handle is cancelled
before it starts ends at once with ``finish_reason="cancelled"``.  Two ways to serve them:

* one at a time, first come, first served: ``run_request(handle)`` runs a whole generation;
* batched (``batched=True``): every request that arrives is handed to ``start_request`` at once
  (the engine's scheduler orders them: scheduler.py) and the thread calls ``run_step`` while
  anything is in flight, so requests join and leave between steps.
The handle API is the same either way.
"""
from __future__ import annotations

import queue
import threading
import traceback
from typing import Callable

from .api import DoneEvent, EngineBusy, EngineClosed, ErrorEvent, Event, GenerationRequest, RequestHandle, Usage


class EngineThread:
    def __init__(self, max_queue: int = 64, name: str = "bw24chat-engine", batched: bool = False):
        self._requests: queue.Queue[RequestHandle | None] = queue.Queue()
        self.max_queue = max_queue
        self.batched = batched
        self._submit_lock = threading.Lock()
        self._closed = False
        self._busy = threading.Event()
        self._thread = threading.Thread(target=self._batch_loop if batched else self._loop, name=name, daemon=True)
        self._thread.start()

    # -- to be provided by the engine: one at a time
    def run_request(self, handle: RequestHandle) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- to be provided by a batching engine
    def start_request(self, handle: RequestHandle) -> None:  # pragma: no cover - abstract
        """Take the request into the batch (or end it with an ErrorEvent)."""
        raise NotImplementedError

    def run_step(self) -> bool:  # pragma: no cover - abstract
        """One step of the requests in flight (each ends with exactly one final event); False if
        none could run (the loop then waits a moment instead of spinning)."""
        raise NotImplementedError

    def in_flight(self) -> tuple[int, int]:  # pragma: no cover - abstract
        """(requests taken but not yet started, requests running)."""
        raise NotImplementedError

    def abort_all(self, message: str) -> None:  # pragma: no cover - abstract
        """End every request in flight with an ErrorEvent."""
        raise NotImplementedError

    # -- client API
    def submit(self, request: GenerationRequest, on_event: Callable[[Event], None] | None = None) -> RequestHandle:
        if self._closed:
            raise EngineClosed("the engine is closed")
        handle = RequestHandle(request, on_event)
        with self._submit_lock:
            if not request.interactive and self._waiting() >= self.max_queue:
                raise EngineBusy(f"{self.max_queue} requests are already waiting")
            self._requests.put(handle)
        return handle

    def _waiting(self) -> int:
        return self._requests.qsize() + (self.in_flight()[0] if self.batched else 0)

    def queue_depth(self) -> int:
        """Requests waiting plus those running."""
        if self.batched:
            waiting, running = self.in_flight()
            return self._requests.qsize() + waiting + running
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

    def _batch_loop(self) -> None:
        ran = True
        while True:
            busy = any(self.in_flight())
            try:  # block only when nothing is in flight; wait a moment when nothing could run
                handle = self._requests.get(block=not busy or not ran, timeout=0.01 if busy and not ran else None)
            except queue.Empty:
                handle = False
            while handle is not False:
                if handle is None:
                    self.abort_all("the engine was closed")
                    return
                self._start(handle)
                try:
                    handle = self._requests.get_nowait()
                except queue.Empty:
                    handle = False
            try:
                ran = self.run_step()
            except Exception as exc:  # noqa: BLE001 - every failure must reach the clients
                traceback.print_exc()
                self.abort_all(f"{type(exc).__name__}: {exc}")

    def _start(self, handle: RequestHandle) -> None:
        if handle.cancelled:
            handle.emit(DoneEvent("cancelled", Usage(0, 0)))
            return
        try:
            self.start_request(handle)
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            if not handle.done:
                handle.emit(ErrorEvent(f"{type(exc).__name__}: {exc}"))
