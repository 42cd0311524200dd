"""Generation, top to bottom: prefill (chunked, reusing the cached prefix of the previous turn),
the decode step, the speculative step (speculative.py: drafters), and the sampling/stopping loop
around them.

The runner (backends/runner.py: NumpyRunner or CudaRunner) samples on its own backend and
returns token ids; this module turns them into a stream of whole characters.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .api import SamplingParams, TokenLogprob
from .sampling import log_softmax
from .speculative import Drafter, DraftLength, SpecCounters, StepCosts
from .stopping import LoopDetector, StopMatcher
from .tokenizer import StreamDecoder, TokenizerInfo


@dataclass
class GenerationResult:
    finish_reason: str
    text: str
    token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    prefill_tps: float
    decode_tps: float
    seed: int
    stats: dict = field(default_factory=dict)


class ContextFull(ValueError):
    pass


class Output:
    """One generation's output side, token by token: stop ids and strings, loop detection,
    max_tokens and the end of the context decide the finish; whole characters are streamed to
    ``on_text`` with their ids (and top-``logprobs`` log-probabilities).  Shared by the
    one-sequence loop (Generator.generate) and the batched scheduler (scheduler.py)."""

    def __init__(self, tok: TokenizerInfo, sp: SamplingParams, n_prompt: int, n_ctx: int,
                 on_text: Callable[[str, list[int], list[TokenLogprob] | None], None] | None = None, logprobs: int = 0):
        self.tok, self.sp, self.n_prompt, self.n_ctx, self.on_text, self.logprobs = tok, sp, n_prompt, n_ctx, on_text, logprobs
        self.stream = StreamDecoder(tok)
        self.stopper = StopMatcher(sp.stop)
        self.loops = LoopDetector(sp.stop_on_loop)
        self.ids: list[int] = []
        self.text_parts: list[str] = []
        self.finish = "length"
        self._pending_ids: list[int] = []
        self._pending_lp: list[TokenLogprob] = []

    def feed(self, tok: int, logits: Callable[[], np.ndarray]) -> bool:
        """The next sampled token (``logits()``: the row it was sampled from, read only for
        logprobs); False once the generation is over (``finish`` says why)."""
        if len(self.ids) >= self.sp.max_tokens:
            self.finish = "length"
            return False
        if tok in self.tok.stop_ids and not self.sp.ignore_eos:
            self.finish = "stop"
            return False
        if self.logprobs:
            self._pending_lp.append(self._logprob(logits(), tok))
        self.ids.append(tok)
        self._pending_ids.append(tok)
        piece = self.stopper.feed(self.stream.push(tok))
        if piece or (self._pending_lp and self.stopper.stopped):
            self._emit(piece)
        if self.stopper.stopped:
            self.finish = "stop"
            return False
        if self.loops.feed(tok):
            self.finish = "loop"
            return False
        if self.n_prompt + len(self.ids) >= self.n_ctx:
            self.finish = "context_full"
            return False
        if len(self.ids) >= self.sp.max_tokens:
            self.finish = "length"
            return False
        return True

    def close(self) -> str:
        """Flush what is held back (a partial character, a possible stop string's start); the
        whole text."""
        tail = self.stopper.flush() + (self.stream.flush() if not self.stopper.stopped else "")
        if tail or self._pending_ids:
            self._emit(tail)
        return "".join(self.text_parts)

    def _emit(self, piece: str) -> None:
        if self.on_text:
            self.on_text(piece, self._pending_ids, self._pending_lp or None)
        self.text_parts.append(piece)
        self._pending_ids, self._pending_lp = [], []

    def _logprob(self, logits: np.ndarray, tok: int) -> TokenLogprob:
        lp = log_softmax(np.asarray(logits))
        top = np.argsort(-lp, kind="stable")[:self.logprobs]
        d = self.tok.decode
        return TokenLogprob(d([tok], False), tok, float(lp[tok]), [(d([int(i)], False), int(i), float(lp[i])) for i in top])


class Generator:
    def __init__(self, runner, tokenizer: TokenizerInfo, prefill_chunk: int = 512):
        self.runner = runner
        self.tok = tokenizer
        self.prefill_chunk = prefill_chunk
        self.cached: list[int] = []  # ids whose K/V sit in the runner's cache, positions 0..
        self.costs = StepCosts()  # the runner's round time per row count, across requests (--spec-k auto)

    # ------------------------------------------------------------------ prefill
    def prefill(self, ids: list[int], sp: SamplingParams, seed: int, hidden: list | None = None) -> tuple[int, int]:
        """Make the cache hold ``ids``; return (the token sampled after the last id, reused prefix
        length).  The common prefix with what the cache already holds is kept (multi-turn chats
        prefill only the new turn); at least the last id is always recomputed for its logits.
        With ``hidden`` (a list), nothing is reused and the trunk's hidden states of every row are
        appended to it (an MTP head needs them all: its cache is not kept across requests)."""
        n = len(ids)
        if n == 0:
            raise ValueError("empty prompt")
        if n >= self.runner.n_ctx:
            raise ContextFull(f"the prompt is {n} tokens; the context holds {self.runner.n_ctx}")
        reuse = 0
        limit = min(len(self.cached), n - 1) if hidden is None else 0
        while reuse < limit and self.cached[reuse] == ids[reuse]:
            reuse += 1
        self.truncate(reuse)
        tok = None
        for s in range(reuse, n, self.prefill_chunk):
            chunk = np.asarray(ids[s : s + self.prefill_chunk], dtype=np.int64)
            last = s + self.prefill_chunk >= n
            tok = self.runner.prefill(chunk, s, sp if last else None, seed, ids[:s])
            if hidden is not None:
                hidden.append(self.runner.last_hidden())
            self.cached.extend(int(t) for t in chunk)
        return tok, reuse

    # ------------------------------------------------------------------ decode step
    def decode(self, token: int, sp: SamplingParams, seed: int, history: list[int]) -> int:
        """``token`` at the next position -> the token sampled after it (history: the ids
        before ``token``)."""
        pos = len(self.cached)
        nxt = self.runner.step([token], pos, sp, seed, history)[0]
        self.cached.append(token)
        return nxt

    # ------------------------------------------------------------------ speculative step
    def speculate(self, token: int, drafts: list[int], sp: SamplingParams, seed: int, history: list[int]) -> list[int]:
        """``token`` at the next position and the K drafts after it, verified in ONE step of K + 1
        rows -> the accepted drafts and the bonus token (1..K + 1 tokens).  Row i's token is drawn
        as plain decoding would draw it at that position, so draft i is accepted iff it equals
        row i - 1's token and every draft before it was accepted (Leviathan et al. 2023, with the
        draw fixed by (seed, position) instead of a rejection test: the output is plain
        decoding's, token for token).  The row after the last accepted draft gives the bonus."""
        pos = len(self.cached)
        sampled = self.runner.step([token, *drafts], pos, sp, seed, history)
        a = 0
        while a < len(drafts) and drafts[a] == sampled[a]:
            a += 1
        self.cached += [token, *drafts[:a]]
        self.truncate(len(self.cached))  # the rejected drafts' positions are stale
        return sampled[:a + 1]

    def truncate(self, n: int) -> None:
        """Keep the cache's first n positions."""
        del self.cached[n:]
        self.runner.rollback(n)

    # ------------------------------------------------------------------ the loop
    def generate(
        self,
        prompt_ids: list[int],
        sp: SamplingParams,
        on_text: Callable[[str, list[int], list[TokenLogprob] | None], None] | None = None,
        cancelled: Callable[[], bool] = lambda: False,
        logprobs: int = 0,
        on_stats: Callable[[dict], None] | None = None,
        drafter: Drafter | None = None,
        spec_k: int = 0,
    ) -> GenerationResult:
        """``drafter`` (None: plain decoding) proposes up to ``spec_k`` drafts a step (0: adaptive,
        speculative.DraftLength); the tokens are plain decoding's either way."""
        seed = sp.seed if sp.seed is not None else secrets.randbits(63)
        t0 = time.perf_counter()
        needs_hidden = bool(drafter and drafter.needs_hidden)
        hidden: list | None = [] if needs_hidden else None
        tok, reused = self.prefill(prompt_ids, sp, seed, hidden)
        t_first = time.perf_counter()
        n_prefilled = len(prompt_ids) - reused
        history = list(prompt_ids)
        out = Output(self.tok, sp, len(prompt_ids), self.runner.n_ctx, on_text, logprobs)
        t_dec = t_first
        last_stats = t_first
        k = DraftLength(spec_k, self.costs)
        spec = SpecCounters()
        if drafter:
            drafter.begin(prompt_ids)
        if needs_hidden:
            drafter.prime(np.concatenate(hidden), sp, seed)
        ready = [(0, tok)]  # sampled, not yet emitted: (row of last_logits(), token)
        while True:
            if cancelled():
                out.finish = "cancelled"
                break
            row, tok = ready.pop(0)
            if not out.feed(tok, lambda: self.runner.last_logits()[row]):
                break
            history.append(tok)
            if ready:  # the rest of an accepted run: the checks above apply to each token
                continue
            # the history only feeds the repetition penalty: skip the copy when it is off
            before = history[:-1] if sp.repeat_penalty != 1.0 else []
            t_round = time.perf_counter()
            # drafts + the bonus token never exceed what max_tokens and the context still allow
            if drafter:
                k.use(drafter.confidence(history))
            n = min(k.choose(), sp.max_tokens - len(out.ids) - 1, self.runner.n_ctx - len(history) - 1) if drafter else 0
            drafts = drafter.propose(history, n) if n > 0 else []
            if drafts:
                new = self.speculate(tok, drafts, sp, seed, before)
                spec.add(len(drafts), len(new) - 1)
                k.update(len(drafts), len(new) - 1)
                drafter.verified(len(new) - 1, len(self.cached), self.runner.last_hidden() if needs_hidden else None)
            else:
                new = [self.decode(tok, sp, seed, before)]
                if needs_hidden:  # the head pairs every trunk row, drafted or not
                    drafter.verified(0, len(self.cached), self.runner.last_hidden())
            now = time.perf_counter()
            self.costs.observe(1 + len(drafts), now - t_round)
            ready = list(enumerate(new))
            if on_stats and now - last_stats > 0.25:
                last_stats = now
                on_stats({"decode_tps": (len(out.ids) - 1) / max(now - t_dec, 1e-9), "ctx_used": len(history), "generated_tokens": len(out.ids),
                          **(spec.stats() if drafter else {})})
        out_ids = out.ids
        # a stop inside an accepted run: the cache keeps no token beyond the output
        self.truncate(min(len(self.cached), len(prompt_ids) + len(out_ids)))
        text = out.close()
        t_end = time.perf_counter()
        n_dec = max(len(out_ids) - 1, 0)  # the first token comes from the prefill's logits
        return GenerationResult(
            finish_reason=out.finish,
            text=text,
            token_ids=out_ids,
            prompt_tokens=len(prompt_ids),
            cached_tokens=reused,
            ttft_s=t_first - t0,
            prefill_tps=n_prefilled / max(t_first - t0, 1e-9),
            decode_tps=n_dec / max(t_end - t_dec, 1e-9) if n_dec else 0.0,
            seed=seed,
            stats=spec.stats() if drafter else {},
        )
