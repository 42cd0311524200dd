"""The engine API: what the TUI, the headless mode and the server talk to.

The engine runs in its own thread.  A client builds a :class:`GenerationRequest`, calls
``engine.submit(request)`` and receives a :class:`RequestHandle`; events then arrive on the
handle (iterate ``handle.events()``, or poll ``handle.get(timeout)``) and, if given, through
the ``on_event`` callback, which is called *from the engine thread* (async clients hop back to
their loop with ``loop.call_soon_threadsafe``).  ``handle.cancel()`` stops a generation at the
next decode step; the stream then ends with ``DoneEvent(finish_reason="cancelled")``.

Every stream is: zero or more TokenEvent / StatsEvent, then exactly one DoneEvent or ErrorEvent.

Stats keys (a key is present only when the engine has that figure; consumers must not assume
any key):  ``decode_tps``, ``prefill_tps``, ``ttft_s``, ``prompt_tokens``, ``generated_tokens``,
``ctx_used``, ``ctx_max``, ``vram_used``, ``vram_total`` (bytes), ``gpu_name``, ``backend``,
``cached_tokens`` (prompt tokens reused from the previous turn's KV cache).
Speculative decoding adds ``spec_rounds`` (verify steps), ``spec_drafted``, ``spec_accepted``,
``spec_acceptance`` (accepted / drafted) and ``spec_mean_len`` (tokens per verify step).
A batching engine (scheduler.py) adds per request ``queue_s`` (submitted -> first scheduled) and
``preemptions``, and engine-wide ``batch_running``, ``batch_waiting``, ``batch_size`` (sequences in
the last step), ``batch_max``, ``batch_steps``, ``batch_rows``, ``kv_blocks_total`` / ``_used`` /
``_cached``, ``kv_block_tokens``, ``prefix_hit_tokens`` / ``prefix_query_tokens`` (prompt positions
found in / looked up in the prefix cache), ``kv_evictions`` and ``batch_preemptions`` (totals).
"""
from __future__ import annotations

import itertools
import queue
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Union


# ----------------------------------------------------------------------------- requests
@dataclass
class SamplingParams:
    """Sampling and stopping.  temperature == 0 means greedy."""

    temperature: float = 0.7
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    min_p: float = 0.0  # 0.0: off
    repeat_penalty: float = 1.0  # 1.0: off (llama.cpp / CTRL-style penalty)
    repeat_last_n: int = 64
    stop_on_loop: int = 0  # stop once the same phrase has repeated for this many tokens (0: off)
    seed: int | None = None  # None: a fresh random seed per request
    max_tokens: int = 512
    stop: list[str] = field(default_factory=list)
    # the model's end-of-sequence tokens do not end the generation (they are decoded as text):
    # load tests and benchmarks that need exactly max_tokens tokens (llama.cpp's and vLLM's ignore_eos)
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class GenerationRequest:
    """One of ``messages`` (chat, rendered through the model's chat template), ``prompt`` (raw
    text, tokenized as is, for completions) or ``prompt_ids`` (token ids as they are: the OpenAI
    completions' token-array prompt, and load generators that want prompts of an exact length)."""

    messages: list[dict] | None = None
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    add_generation_prompt: bool = True
    logprobs: int = 0  # top-N log-probabilities per generated token (0: none)
    echo: bool = False
    spec: str | None = None  # speculative decoding: off | ngram | mtp; None: the engine's --spec
    spec_k: int | None = None  # drafts per step (0: adaptive); None: the engine's --spec-k
    # the user at the keyboard (the TUI): a batching engine runs it ahead of server load, and a
    # full queue never refuses it
    interactive: bool = False

    def __post_init__(self):
        if sum(x is not None for x in (self.messages, self.prompt, self.prompt_ids)) != 1:
            raise ValueError("GenerationRequest takes exactly one of messages=, prompt= or prompt_ids=")


# ----------------------------------------------------------------------------- events
@dataclass
class TokenLogprob:
    token: str
    token_id: int
    logprob: float
    top: list[tuple[str, int, float]] = field(default_factory=list)  # (text, id, logprob)


@dataclass
class TokenEvent:
    """New text.  ``text`` is always whole UTF-8 characters (a character split across tokens
    arrives once, whole, in the event of the token that completes it)."""

    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None


@dataclass
class StatsEvent:
    stats: dict


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class DoneEvent:
    finish_reason: str  # "stop" | "length" | "context_full" | "cancelled" | "loop"
    usage: Usage
    stats: dict = field(default_factory=dict)
    text: str = ""  # the whole generated text (stop string excluded)


@dataclass
class ErrorEvent:
    message: str


Event = Union[TokenEvent, StatsEvent, DoneEvent, ErrorEvent]


@dataclass
class LoadProgress:
    """Reported while a model loads: stage in ("downloading", "reading", "uploading", "compiling", "ready")."""

    stage: str
    fraction: float  # 0..1 within the stage
    detail: str = ""


@dataclass
class ModelInfo:
    name: str
    path: str
    arch: str
    n_params: int
    n_ctx: int
    backend: str  # "numpy" | "cuda"
    device_name: str
    formats: dict[str, str] = field(default_factory=dict)  # tensor name -> format, e.g. "Q4_1"
    chat_template: bool = True
    id: str = ""  # the clean model id (repo id or file stem) clients use; "" means name
    aliases: tuple[str, ...] = ()  # other ids a client may use for this model
    sampling_defaults: dict = field(default_factory=dict)  # model_sampling(): what unset values take
    sampling_source: str = ""
    vocab_size: int = 0  # token ids run 0 .. vocab_size - 1 (0: not known)

    @property
    def model_id(self) -> str:
        return self.id or self.name


class EngineBusy(Exception):
    """submit() when the bounded request queue is full (the server answers 429)."""


class EngineClosed(Exception):
    pass


# ----------------------------------------------------------------------------- handles
_ids = itertools.count(1)


class RequestHandle:
    """One submitted request.  Thread-safe: the engine thread puts, any thread reads."""

    def __init__(self, request: GenerationRequest, on_event: Callable[[Event], None] | None = None):
        self.id = next(_ids)
        self.request = request
        self._queue: queue.SimpleQueue[Event] = queue.SimpleQueue()  # C-implemented: a put per token is cheap
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._on_event = on_event

    # engine side
    def emit(self, event: Event) -> None:
        self._queue.put(event)
        if isinstance(event, (DoneEvent, ErrorEvent)):
            self._done.set()
        if self._on_event is not None:
            self._on_event(event)

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    # client side
    def cancel(self) -> None:
        self._cancel.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def get(self, timeout: float | None = None) -> Event:
        """Next event; raises queue.Empty on timeout."""
        return self._queue.get(timeout=timeout)

    def events(self) -> Iterator[Event]:
        """Every event of this request, ending with its DoneEvent or ErrorEvent."""
        while True:
            ev = self._queue.get()
            yield ev
            if isinstance(ev, (DoneEvent, ErrorEvent)):
                return

    def result(self) -> tuple[str, DoneEvent | ErrorEvent]:
        """Block until the end; return (text, final event)."""
        parts = []
        for ev in self.events():
            if isinstance(ev, TokenEvent):
                parts.append(ev.text)
            elif isinstance(ev, (DoneEvent, ErrorEvent)):
                return "".join(parts), ev
        raise AssertionError("unreachable")


class EngineAPI(Protocol):
    """What every engine (real or fake) offers."""

    info: ModelInfo

    def submit(self, request: GenerationRequest, on_event: Callable[[Event], None] | None = None) -> RequestHandle: ...

    def render_prompt(self, messages: list[dict], add_generation_prompt: bool = True) -> str: ...

    def count_tokens(self, text: str) -> int: ...

    def stats(self) -> dict: ...

    def queue_depth(self) -> int: ...

    def close(self) -> None: ...
