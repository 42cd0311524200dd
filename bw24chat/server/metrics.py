"""Server counters and their Prometheus text exposition (``GET /metrics``).

Engine events are observed from the engine thread (so a generation whose client went away is
still counted, as ``finish_reason="cancelled"``); HTTP answers from the event loop.  One lock
guards both.
"""
from __future__ import annotations

import math
import threading
import time
from collections import Counter

from ..api import DoneEvent, ErrorEvent, Event, ModelInfo, StatsEvent


def _label(v: object) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**kv: object) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in kv.items()) + "}" if kv else ""


def _number(v: float) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
        return str(int(v))
    return repr(v)


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = time.time()
        self.http = Counter()  # (endpoint, status) -> answers
        self.in_progress = 0
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.generations = Counter()  # finish reason (or "error") -> generations
        self.last_stats: dict = {}
        self.spec = Counter()  # speculative decoding: spec_rounds / spec_drafted / spec_accepted, summed
        self._duration_ema: float | None = None

    # -- recording
    def http_started(self) -> None:
        with self._lock:
            self.in_progress += 1

    def http_finished(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.in_progress -= 1
            self.http[(endpoint, status)] += 1

    def observe(self, event: Event, elapsed_s: float) -> None:
        """An engine event, ``elapsed_s`` after its request was submitted (engine thread)."""
        with self._lock:
            if isinstance(event, StatsEvent):
                self.last_stats.update(event.stats)
            elif isinstance(event, DoneEvent):
                if event.finish_reason != "cancelled":  # a cut-short run's speeds mislead
                    self.last_stats.update(event.stats)
                self.prompt_tokens += event.usage.prompt_tokens
                self.generated_tokens += event.usage.completion_tokens
                self.generations[event.finish_reason] += 1
                self.spec.update({k: event.stats[k] for k in ("spec_rounds", "spec_drafted", "spec_accepted") if k in event.stats})
                if event.finish_reason != "cancelled":
                    ema = self._duration_ema
                    self._duration_ema = elapsed_s if ema is None else 0.8 * ema + 0.2 * elapsed_s
            elif isinstance(event, ErrorEvent):
                self.generations["error"] += 1

    def retry_after_s(self) -> int:
        """A guess at when a queue slot frees: about one request's time (1..60 s)."""
        with self._lock:
            ema = self._duration_ema
        return int(min(60, max(1, math.ceil(ema or 1))))

    # -- exposition
    def render(self, info: ModelInfo, model_name: str, queue_depth: int, engine_stats: dict) -> str:
        with self._lock:
            stats = {**self.last_stats, **engine_stats}
            http = sorted(self.http.items())
            gens = sorted(self.generations.items())
            snapshot = (self.in_progress, self.prompt_tokens, self.generated_tokens)
            spec = dict(self.spec)
        in_progress, prompt_tokens, generated_tokens = snapshot
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[dict, float]]) -> None:
            out.append(f"# HELP bw24chat_{name} {help_}")
            out.append(f"# TYPE bw24chat_{name} {kind}")
            out.extend(f"bw24chat_{name}{_labels(**labels)} {_number(value)}" for labels, value in samples)

        metric("info", "gauge", "The model being served.",
               [({"model": model_name, "backend": info.backend, "device": info.device_name}, 1)])
        metric("http_requests_total", "counter", "HTTP requests answered, by endpoint and status code.",
               [({"endpoint": e, "status": s}, n) for (e, s), n in http])
        metric("http_requests_in_progress", "gauge", "HTTP requests being answered now.", [({}, in_progress)])
        metric("prompt_tokens_total", "counter", "Prompt tokens of finished generations.", [({}, prompt_tokens)])
        metric("generated_tokens_total", "counter", "Tokens generated.", [({}, generated_tokens)])
        metric("generations_total", "counter", "Finished generations by finish reason (cancelled: the client left).",
               [({"finish_reason": r}, n) for r, n in gens])
        metric("queue_depth", "gauge", "Requests waiting in the engine queue plus the one running.", [({}, queue_depth)])
        for key, name, help_ in (
            ("decode_tps", "decode_tokens_per_second", "Decode speed of the last generation."),
            ("prefill_tps", "prefill_tokens_per_second", "Prefill speed of the last generation."),
            ("spec_acceptance", "spec_acceptance_ratio", "Speculative drafts accepted / drafted, last speculative generation."),
            ("spec_mean_len", "spec_tokens_per_step", "Tokens per speculative verify step, last speculative generation."),
            ("vram_used", "vram_used_bytes", "GPU memory in use."),
            ("vram_total", "vram_total_bytes", "GPU memory in all."),
        ):
            v = stats.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                metric(name, "gauge", help_, [({}, float(v))])
        for key, help_ in (("spec_rounds", "Speculative verify steps."), ("spec_drafted", "Speculative draft tokens proposed."),
                           ("spec_accepted", "Speculative draft tokens accepted.")):
            if key in spec:
                metric(f"{key}_total", "counter", help_, [({}, spec[key])])
        metric("uptime_seconds", "gauge", "Seconds since the server started.", [({}, float(time.time() - self.started))])
        return "\n".join(out) + "\n"
