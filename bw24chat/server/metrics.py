"""Server counters and their Prometheus text exposition (``GET /metrics``).

Engine events are observed from the engine thread (so a generation whose client went away is
still counted, as ``finish_reason="cancelled"``); HTTP answers from the event loop.  One lock
guards both.  Per generation (each choice of a request): histograms of its prompt and completion
tokens, time to first token, time in the queue, time per output token and end-to-end time (the
names follow vLLM's ``/metrics``).  A batching engine's queue and batch figures (running,
waiting, the last step's batch size, KV blocks, prefix-cache hits, preemptions) come from its
stats at each scrape.
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


class Histogram:
    """A Prometheus histogram: cumulative bucket counts, sum and count."""

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1
        self.sum += v
        self.count += 1

    def samples(self) -> list[tuple[str, dict, float]]:
        out = [("_bucket", {"le": _number(float(b))}, c) for b, c in zip(self.buckets, self.counts)]
        return out + [("_bucket", {"le": "+Inf"}, self.count), ("_sum", {}, self.sum), ("_count", {}, self.count)]


_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_PER_TOKEN = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
# (histogram name, help, buckets): what each finished generation adds
HISTOGRAMS = {
    "request_prompt_tokens": ("Prompt tokens per generation.", _TOKENS),
    "request_generation_tokens": ("Completion tokens per generation.", _TOKENS),
    "time_to_first_token_seconds": ("Time from submission to the first token.", _SECONDS),
    "request_queue_time_seconds": ("Time from submission to the first scheduled step (batching engines).", _SECONDS),
    "time_per_output_token_seconds": ("Mean time between output tokens of a generation.", _PER_TOKEN),
    "e2e_request_latency_seconds": ("Time from submission to the final event.", _SECONDS),
}
# a batching engine's stats: key -> (metric, kind, help)
BATCH_STATS = {
    "batch_running": ("requests_running", "gauge", "Requests in the batch (admitted, holding KV blocks)."),
    "batch_waiting": ("requests_waiting", "gauge", "Requests waiting to be admitted to the batch."),
    "batch_size": ("batch_size", "gauge", "Sequences in the last batched step."),
    "batch_max": ("batch_max", "gauge", "Most sequences a batched step takes."),
    "kv_blocks_total": ("kv_blocks_total", "gauge", "Blocks of the paged KV pool."),
    "kv_blocks_used": ("kv_blocks_used", "gauge", "KV blocks held by running requests."),
    "kv_blocks_cached": ("kv_blocks_cached", "gauge", "KV blocks kept for prefix reuse (evictable)."),
    "batch_steps": ("batch_steps_total", "counter", "Batched steps run."),
    "batch_rows": ("batch_rows_total", "counter", "Rows (prompt and generated tokens) run in batched steps."),
    "prefix_hit_tokens": ("prefix_cache_hit_tokens_total", "counter", "Prompt tokens taken from the prefix cache."),
    "prefix_query_tokens": ("prefix_cache_query_tokens_total", "counter", "Prompt tokens looked up in the prefix cache."),
    "kv_evictions": ("kv_evictions_total", "counter", "Cached KV blocks evicted for new ones."),
    "batch_preemptions": ("preemptions_total", "counter", "Requests preempted (recomputed later) for want of KV blocks."),
}


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
        self.hist = {name: Histogram(buckets) for name, (_, buckets) in HISTOGRAMS.items()}
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
                self._observe_request(event, elapsed_s)
            elif isinstance(event, ErrorEvent):
                self.generations["error"] += 1

    def _observe_request(self, done: DoneEvent, elapsed_s: float) -> None:
        st, h = done.stats or {}, self.hist
        h["request_prompt_tokens"].observe(done.usage.prompt_tokens)
        h["request_generation_tokens"].observe(done.usage.completion_tokens)
        h["e2e_request_latency_seconds"].observe(elapsed_s)
        if done.usage.completion_tokens and isinstance(st.get("ttft_s"), (int, float)):
            h["time_to_first_token_seconds"].observe(st["ttft_s"])
        if isinstance(st.get("queue_s"), (int, float)):
            h["request_queue_time_seconds"].observe(st["queue_s"])
        if done.usage.completion_tokens > 1 and st.get("decode_tps"):
            h["time_per_output_token_seconds"].observe(1.0 / st["decode_tps"])

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
            hists = {name: h.samples() for name, h in self.hist.items()}
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
        metric("queue_depth", "gauge", "Requests waiting in the engine queue plus those running.", [({}, queue_depth)])
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
        for key, (name, kind, help_) in BATCH_STATS.items():
            v = stats.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                metric(name, kind, help_, [({}, v)])
        for name, (help_, _) in HISTOGRAMS.items():
            out.append(f"# HELP bw24chat_{name} {help_}")
            out.append(f"# TYPE bw24chat_{name} histogram")
            out.extend(f"bw24chat_{name}{suffix}{_labels(**labels)} {_number(float(v))}" for suffix, labels, v in hists[name])
        metric("uptime_seconds", "gauge", "Seconds since the server started.", [({}, float(time.time() - self.started))])
        return "\n".join(out) + "\n"
