"""A scripted engine with the real engine's API, for UI and server tests (and `--fake` demos).

It "tokenizes" into words-with-leading-space, streams a scripted reply at a set pace (deterministic: the same request gives the same text), honours
max_tokens, stop strings, cancel and seeds, and reports every stats field the real engine may
report, so that UIs can be tested against all of them; the speculative-decoding figures only
for a request with speculation on (its ``spec``, else the engine's), as the real engine does.  A user message containing ``[[error]]`` makes it fail mid-stream; ``[[slow]]`` makes it
stream 10x slower.
"""
from __future__ import annotations

import re
import time
from typing import Callable

from .api import (
    DoneEvent,
    ErrorEvent,
    Event,
    GenerationRequest,
    ModelInfo,
    RequestHandle,
    StatsEvent,
    TokenEvent,
    TokenLogprob,
    Usage,
)
from .engine_thread import EngineThread
from .speculative import SpecCounters
from .stopping import StopMatcher

_WORDS = re.compile(r"\s*\S+|\s+")

DEFAULT_REPLY = (
    "Here is a short answer.\n\n```python\nprint('hello from bw24chat')\n```\n\n"
    "- point one\n- point two\n\nDone."
)


class FakeEngine(EngineThread):
    def __init__(
        self,
        replies: list[str] | Callable[[GenerationRequest], str] | None = None,
        token_delay: float = 0.005,
        n_ctx: int = 4096,
        max_queue: int = 64,
        spec: str = "off",
        spec_k: int = 0,
    ):
        self._replies = replies
        self._reply_index = 0
        self.token_delay = token_delay
        self.requests: list[GenerationRequest] = []
        self.info = ModelInfo(
            name="fake-model",
            path="<fake>",
            arch="llama",
            n_params=135_000_000,
            n_ctx=n_ctx,
            backend="fake",
            device_name="Fake GPU",
            formats={"tok_embd": "Q8_0", **{f"blk.{i}.{r}": "Q4_1" for i in range(4) for r in ("attn_q", "ffn_down")},
                     "blk.4.ffn_down": "Q6_K", "output_norm": "F32"},
        )
        self._ctx_used = 0
        self.spec, self.spec_k = spec, spec_k
        super().__init__(max_queue=max_queue, name="bw24chat-fake-engine")

    # ------------------------------------------------------------------ API
    def render_prompt(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        out = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        return out + ("<|assistant|>" if add_generation_prompt else "")

    def count_tokens(self, text: str) -> int:
        return len(_WORDS.findall(text))

    def stats(self) -> dict:
        return {
            "backend": "fake",
            "gpu_name": "Fake GPU",
            "vram_used": 3 * 2**30,
            "vram_total": 24 * 2**30,
            "kv_bytes": 96 * 2**20,
            "rss": 1536 * 2**20,
            "ctx_used": self._ctx_used,
            "ctx_max": self.info.n_ctx,
        }

    # ------------------------------------------------------------------ worker
    def _reply_for(self, request: GenerationRequest) -> str:
        if callable(self._replies):
            return self._replies(request)
        if self._replies:
            reply = self._replies[self._reply_index % len(self._replies)]
            self._reply_index += 1
            return reply
        return DEFAULT_REPLY

    def run_request(self, handle: RequestHandle) -> None:
        req = handle.request
        self.requests.append(req)
        sp = req.sampling
        if req.prompt_ids is not None:  # the fake tokenizer's "ids" are its words
            prompt = " ".join(map(str, req.prompt_ids))
        else:
            prompt = req.prompt if req.prompt is not None else self.render_prompt(req.messages or [], req.add_generation_prompt)
        n_prompt = len(req.prompt_ids) if req.prompt_ids is not None else self.count_tokens(prompt)
        reply = self._reply_for(req)
        pieces = _WORDS.findall(reply)
        delay = self.token_delay * (10 if "[[slow]]" in prompt else 1)
        t0 = time.perf_counter()
        time.sleep(delay)
        ttft = time.perf_counter() - t0
        text = ""
        n_gen = 0
        finish = "stop"
        stopper = StopMatcher(sp.stop)
        t_dec = time.perf_counter()
        # scripted speculation: a round every second token, K drafts of which one is accepted
        spec = SpecCounters() if (req.spec or self.spec) != "off" else None
        k = (self.spec_k if req.spec_k is None else req.spec_k) or 4
        for i, piece in enumerate(pieces):
            if handle.cancelled:
                finish = "cancelled"
                break
            if "[[error]]" in prompt and i == 3:
                handle.emit(ErrorEvent("fake engine failure (requested by [[error]])"))
                return
            if n_gen >= sp.max_tokens:
                finish = "length"
                break
            if n_prompt + n_gen >= self.info.n_ctx:
                finish = "context_full"
                break
            n_gen += 1
            if spec is not None and n_gen % 2 == 0:
                spec.add(k, 1)
            self._ctx_used = n_prompt + n_gen
            out = stopper.feed(piece)
            lp = None
            if req.logprobs:
                lp = [TokenLogprob(piece, 1000 + i, -0.1, [(piece, 1000 + i, -0.1), ("x", 7, -2.5)][: req.logprobs])]
            if out or lp:
                handle.emit(TokenEvent(out, [1000 + i], lp))
            text += out
            if stopper.stopped:
                break
            if n_gen % 4 == 0:
                handle.emit(StatsEvent(self._live_stats(n_prompt, n_gen, ttft, t_dec, spec)))
            time.sleep(delay)
        tail = stopper.flush()
        if tail:
            handle.emit(TokenEvent(tail, []))
            text += tail
        stats = self._live_stats(n_prompt, n_gen, ttft, t_dec, spec)
        handle.emit(StatsEvent(stats))
        handle.emit(DoneEvent(finish, Usage(n_prompt, n_gen), stats, text))

    def _live_stats(self, n_prompt: int, n_gen: int, ttft: float, t_dec: float, spec: SpecCounters | None) -> dict:
        dt = max(time.perf_counter() - t_dec, 1e-6)
        s = self.stats()
        s.update(
            decode_tps=n_gen / dt,
            prefill_tps=n_prompt / max(ttft, 1e-6),
            ttft_s=ttft,
            prompt_tokens=n_prompt,
            generated_tokens=n_gen,
            cached_tokens=0,
            **(spec.stats() if spec is not None else {}),
        )
        return s


def collect(handle: RequestHandle) -> list[Event]:
    """All events of a handle (test helper)."""
    return list(handle.events())
