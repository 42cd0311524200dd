"""The OpenAI wire format: request bodies in, response bodies and stream chunks out.

No HTTP here: :func:`parse_chat` / :func:`parse_completion` turn a decoded JSON body into an
engine :class:`~bw24chat.api.GenerationRequest` (raising :class:`APIError` with OpenAI's error
shape for anything wrong), and a :class:`Responder` turns engine events into the JSON objects
of ``/v1/chat/completions`` and ``/v1/completions`` (whole bodies and SSE chunks).

Parameters: ``null`` means "not given" (as at OpenAI).  Unknown parameters are ignored, so that
clients that send extra fields keep working; parameters the engine cannot honour (non-zero
frequency/presence penalties, ``logit_bias``, ``tools``, ``response_format`` other
than text, ``suffix``, ``best_of`` > 1, batched or token-id prompts) are refused with 400
rather than silently ignored.  Omitted sampling parameters take the server's defaults (the
engine flags ``--temperature``, ``--top-p``, ``--max-tokens`` ..., as with llama.cpp's server).
Beyond OpenAI's set, ``top_k``, ``min_p`` and ``repetition_penalty`` (alias ``repeat_penalty``)
reach the sampler, and ``speculative`` (``"off"`` | ``"ngram"`` | ``"mtp"``) with ``speculative_k`` (1..8 or
``"auto"``) choose speculative decoding for the request (omitted: the server's ``--spec`` /
``--spec-k``); the usage then reports the drafts in ``completion_tokens_details``.
``ignore_eos`` (as llama.cpp's and vLLM's servers) keeps decoding past the model's end-of-sequence
tokens, so that load tests get exactly ``max_tokens`` tokens a request.
``n`` (1..MAX_CHOICES) asks for that many choices: the engine generates them as separate requests
(decoded together by a batching engine, the prompt computed once and shared); with a ``seed``,
choice i samples with seed + i, so choice 0 is what n = 1 gives.  Usage counts the prompt once and
the completion tokens of every choice.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ..api import DoneEvent, GenerationRequest, SamplingParams, TokenLogprob
from ..speculative import MAX_K, SPEC_MODES

MAX_STOP_STRINGS = 16
MAX_CHOICES = 16
MAX_TOP_LOGPROBS = 20
CHAT_ROLES = {"system", "developer", "user", "assistant", "tool"}

_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_PIECE = "\x00piece\x00"  # stands for a token's text in a chunk's template (JSON-escaped: never in a model id)

# engine finish reasons -> OpenAI's ("context_full" is a length limit to a client)
FINISH_REASONS = {"stop": "stop", "length": "length", "context_full": "length", "cancelled": "stop"}


class APIError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
             405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
             429: "rate_limit_exceeded", 431: "invalid_request_error", 499: "invalid_request_error", 503: "server_error"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or self.TYPES.get(status, "server_error")
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# ----------------------------------------------------------------------------- validation
_KINDS = {
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}


def _a(kind: str) -> str:
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def _type_name(v: Any) -> str:
    """'a string', 'an integer', ... for error messages."""
    for name, ok in _KINDS.items():
        if ok(v):
            return _a(name)
    return "null" if v is None else type(v).__name__


class _Body:
    """Typed, range-checked access to the fields of a request body."""

    def __init__(self, data: dict):
        self.data = data

    def get(self, name: str, kind: str, default: Any = None, lo: float | None = None, hi: float | None = None) -> Any:
        v = self.data.get(name)
        if v is None:
            return default
        if not _KINDS[kind](v):
            raise APIError(400, f"Invalid type for '{name}': expected {_a(kind)}, "
                                f"but got {_type_name(v)} instead.", name, "invalid_type")
        if lo is not None and v < lo:
            raise APIError(400, f"Invalid '{name}': expected a value >= {lo}, but got {v} instead.", name, "invalid_value")
        if hi is not None and v > hi:
            raise APIError(400, f"Invalid '{name}': expected a value <= {hi}, but got {v} instead.", name, "invalid_value")
        return v

    def refuse_unless(self, name: str, ok: bool, why: str) -> None:
        if self.data.get(name) is not None and not ok:
            raise APIError(400, f"'{name}' {why} on this server.", name, "unsupported_parameter")


@dataclass
class Limits:
    """What the server allows and what it assumes when a request does not say."""

    max_tokens_cap: int = 4096
    defaults: SamplingParams = dataclasses.field(default_factory=SamplingParams)
    vocab_size: int = 0  # token-array prompts are checked against it (0: not known)
    model_id: str = ""  # the served model's id
    models: frozenset[str] = frozenset()  # the ids a request's "model" may name: model_id and its aliases (empty: any)


@dataclass
class ParsedRequest:
    kind: str  # "chat" | "text"
    generation: GenerationRequest
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None  # top-N alternatives to report; None: no logprobs at all
    echo: bool = False  # completions: prepend the prompt to the text
    n: int = 1  # choices

    @property
    def prompt_param(self) -> str:
        return "messages" if self.kind == "chat" else "prompt"

    def choices(self) -> list[GenerationRequest]:
        """One engine request per choice (choice i's seed: the request's + i)."""
        g = self.generation
        if self.n == 1:
            return [g]
        seed = g.sampling.seed
        return [dataclasses.replace(g, sampling=dataclasses.replace(g.sampling, seed=None if seed is None else seed + i))
                for i in range(self.n)]


def _choices(b: _Body) -> int:
    return b.get("n", "integer", 1, lo=1, hi=MAX_CHOICES)


def _sampling(b: _Body, limits: Limits, max_tokens_names: tuple[str, ...]) -> SamplingParams:
    d = limits.defaults
    for name in ("frequency_penalty", "presence_penalty"):
        b.refuse_unless(name, b.get(name, "number", 0, lo=-2, hi=2) == 0, "other than 0 is not supported")
    b.refuse_unless("logit_bias", not b.get("logit_bias", "object", {}), "is not supported")

    max_tokens = None
    for name in max_tokens_names:  # the later name wins (max_completion_tokens over max_tokens)
        v = b.get(name, "integer", lo=1)
        if v is not None:
            if v > limits.max_tokens_cap:
                raise APIError(400, f"'{name}' is {v}, but this server allows at most {limits.max_tokens_cap} "
                                    "tokens per request.", name, "invalid_value")
            max_tokens = v
    if max_tokens is None:
        max_tokens = min(d.max_tokens, limits.max_tokens_cap)

    stop = b.data.get("stop")
    if stop is None:
        stop = list(d.stop)
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise APIError(400, "Invalid type for 'stop': expected a string or an array of strings.", "stop", "invalid_type")
    if len(stop) > MAX_STOP_STRINGS:
        raise APIError(400, f"'stop' takes at most {MAX_STOP_STRINGS} strings.", "stop", "invalid_value")

    rep = b.get("repeat_penalty", "number", d.repeat_penalty, lo=0.01, hi=10)
    return dataclasses.replace(
        d,
        temperature=b.get("temperature", "number", d.temperature, lo=0, hi=2),
        top_p=b.get("top_p", "number", d.top_p, lo=0, hi=1),
        top_k=b.get("top_k", "integer", d.top_k, lo=0),
        min_p=b.get("min_p", "number", d.min_p, lo=0, hi=1),
        repeat_penalty=b.get("repetition_penalty", "number", rep, lo=0.01, hi=10),
        seed=b.get("seed", "integer", d.seed),
        max_tokens=max_tokens,
        stop=[s for s in stop if s],
        ignore_eos=b.get("ignore_eos", "boolean", d.ignore_eos),
    )


def _stream_flags(b: _Body) -> tuple[bool, bool]:
    stream = b.get("stream", "boolean", False)
    opts = _Body(b.get("stream_options", "object", {}))
    return stream, bool(opts.get("include_usage", "boolean", False)) and stream


def _model(b: _Body, limits: Limits) -> None:
    name = b.get("model", "string")
    if name is not None:
        check_model(name, limits)


def check_model(name: str, limits: Limits) -> None:
    """404 model_not_found (OpenAI's answer) unless ``name`` is the served model or an alias."""
    if limits.models and name not in limits.models:
        raise APIError(404, f"The model '{name}' does not exist on this server (it serves '{limits.model_id}').",
                       "model", "model_not_found")


def _message_text(i: int, m: dict) -> str:
    content = m.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise APIError(400, "Only text content parts are supported on this server.",
                               f"messages.[{i}].content", "unsupported_value")
            parts.append(part["text"])
        return "".join(parts)
    raise APIError(400, f"Invalid type for 'messages.[{i}].content': expected a string or an array of "
                        f"content parts, but got {_type_name(content)} instead.", f"messages.[{i}].content", "invalid_type")


def parse_chat(data: dict, limits: Limits) -> ParsedRequest:
    b = _Body(data)
    _model(b, limits)
    messages = b.get("messages", "array")
    if not messages:
        raise APIError(400, "'messages' is required and must be a non-empty array.", "messages", "missing_required_parameter")
    norm = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise APIError(400, f"Invalid type for 'messages.[{i}]': expected an object.", f"messages.[{i}]", "invalid_type")
        role = m.get("role")
        if role not in CHAT_ROLES:
            raise APIError(400, f"Invalid value for 'messages.[{i}].role': expected one of "
                                f"{', '.join(sorted(CHAT_ROLES))}.", f"messages.[{i}].role", "invalid_value")
        norm.append({"role": "system" if role == "developer" else role, "content": _message_text(i, m)})
    b.refuse_unless("tools", not b.get("tools", "array", []), "(tool calling) is not supported")
    b.refuse_unless("functions", not b.get("functions", "array", []), "(function calling) is not supported")
    fmt = b.get("response_format", "object", {"type": "text"})
    b.refuse_unless("response_format", fmt.get("type") == "text", "other than {\"type\": \"text\"} is not supported")
    logprobs = b.get("logprobs", "boolean", False)
    top = b.get("top_logprobs", "integer", 0, lo=0, hi=MAX_TOP_LOGPROBS)
    if top and not logprobs:
        raise APIError(400, "'top_logprobs' requires 'logprobs' to be true.", "top_logprobs", "invalid_value")
    sampling = _sampling(b, limits, ("max_tokens", "max_completion_tokens"))
    stream, include_usage = _stream_flags(b)
    gen = GenerationRequest(messages=norm, sampling=sampling, logprobs=max(top, 1) if logprobs else 0, **_speculative(b))
    return ParsedRequest("chat", gen, stream, include_usage, top if logprobs else None, n=_choices(b))


def _speculative(b: _Body) -> dict:
    """The GenerationRequest fields of the ``speculative`` / ``speculative_k`` extensions (None:
    the server's --spec / --spec-k).  Checked here: the engine would only fail mid-request."""
    mode = b.get("speculative", "string")
    if mode is not None and mode not in SPEC_MODES:
        raise APIError(400, f"Invalid 'speculative': expected one of {', '.join(map(repr, SPEC_MODES))}, "
                            f"but got {mode!r} instead.", "speculative", "invalid_value")
    k = b.data.get("speculative_k")
    if k == "auto":
        k = 0
    elif k is not None:
        k = b.get("speculative_k", "integer", lo=1, hi=MAX_K)
    return {"spec": mode, "spec_k": k}


def parse_completion(data: dict, limits: Limits) -> ParsedRequest:
    b = _Body(data)
    _model(b, limits)
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    ids = None
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids, prompt = prompt, None  # OpenAI's token-array prompt
        V = limits.vocab_size
        bad = next((t for t in ids if t < 0 or (V and t >= V)), None)
        if bad is not None:
            raise APIError(400, f"Token {bad} in 'prompt' is not a token id of this model"
                                + (f" (0 to {V - 1})." if V else "."), "prompt", "invalid_value")
    elif isinstance(prompt, list):
        raise APIError(400, "Only a single prompt, a string or an array of token ids, is supported on this server "
                            "(no batches).", "prompt", "unsupported_value")
    elif not isinstance(prompt, str):
        raise APIError(400, "'prompt' is required and must be a string or an array of token ids.", "prompt",
                       "missing_required_parameter" if prompt is None else "invalid_type")
    b.refuse_unless("suffix", not data.get("suffix"), "is not supported")
    b.refuse_unless("best_of", b.get("best_of", "integer", 1, lo=1) == 1, "other than 1 is not supported")
    logprobs = b.get("logprobs", "integer", None, lo=0, hi=MAX_TOP_LOGPROBS)
    echo = b.get("echo", "boolean", False)
    b.refuse_unless("echo", not (echo and ids is not None), "with a token-array prompt is not supported")
    sampling = _sampling(b, limits, ("max_tokens",))
    stream, include_usage = _stream_flags(b)
    # echo is done here, not by the engine: the prompt text is prepended to the reply
    gen = GenerationRequest(prompt=prompt, prompt_ids=ids, sampling=sampling,
                            logprobs=0 if logprobs is None else max(logprobs, 1), **_speculative(b))
    return ParsedRequest("text", gen, stream, include_usage, logprobs, echo, n=_choices(b))


# ----------------------------------------------------------------------------- responses
def usage_body(dones: list[DoneEvent]) -> dict:
    """The usage of a request's choices: the prompt counted once (choice 0's figures), the
    completion tokens (and speculative drafts) of every choice."""
    first = dones[0]
    completion = sum(d.usage.completion_tokens for d in dones)
    out = {"prompt_tokens": first.usage.prompt_tokens, "completion_tokens": completion,
           "total_tokens": first.usage.prompt_tokens + completion}
    cached = first.stats.get("cached_tokens") if first.stats else None
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": int(cached)}
    spec = [d.stats for d in dones if d.stats and "spec_drafted" in d.stats]
    if spec:  # speculative decoding: OpenAI's predicted-output fields
        accepted = sum(int(st["spec_accepted"]) for st in spec)
        out["completion_tokens_details"] = {"accepted_prediction_tokens": accepted,
                                            "rejected_prediction_tokens": sum(int(st["spec_drafted"]) for st in spec) - accepted}
    return out


def sse(obj: dict | str) -> bytes:
    """One server-sent event: ``data: {json}`` (or ``data: [DONE]``) and the blank line."""
    data = obj if isinstance(obj, str) else _JSON.encode(obj)
    return f"data: {data}\n\n".encode()


def _token_bytes(s: str) -> list[int]:
    return list(s.encode("utf-8", errors="replace"))


class Responder:
    """Builds the response objects of one request (its ``n`` choices); keeps the little state
    that needs (completions' ``text_offset``, per choice)."""

    def __init__(self, parsed: ParsedRequest, model: str, fingerprint: str):
        self.p = parsed
        self.chat = parsed.kind == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = model
        self.fingerprint = fingerprint
        self.echo_text = parsed.generation.prompt if parsed.echo else ""
        self._offset = [len(self.echo_text)] * parsed.n
        self._piece_sse: dict[int, list[bytes]] = {}  # choice -> its text chunk's event around the text

    # -- logprobs
    def _logprobs(self, lps: list[TokenLogprob] | None, index: int) -> dict | None:
        if self.p.logprobs is None:
            return None
        lps = lps or []
        k = self.p.logprobs
        if self.chat:
            return {
                "content": [
                    {"token": t.token, "logprob": t.logprob, "bytes": _token_bytes(t.token),
                     "top_logprobs": [{"token": s, "logprob": lp, "bytes": _token_bytes(s)} for s, _id, lp in t.top[:k]]}
                    for t in lps
                ],
                "refusal": None,
            }
        offsets = []
        for t in lps:
            offsets.append(self._offset[index])
            self._offset[index] += len(t.token)
        return {
            "tokens": [t.token for t in lps],
            "token_logprobs": [t.logprob for t in lps],
            "top_logprobs": [{s: lp for s, _id, lp in t.top[:k]} for t in lps],
            "text_offset": offsets,
        }

    def _choice(self, text: str | None, lps: dict | None, finish: str | None, delta: bool, index: int) -> dict:
        if self.chat:
            if delta:
                body = {"delta": {} if text is None else {"content": text}}
            else:
                body = {"message": {"role": "assistant", "content": text, "refusal": None}}
        else:
            body = {"text": text or ""}
        return {"index": index, **body, "logprobs": lps, "finish_reason": finish}

    def _envelope(self, chunk: bool) -> dict:
        if self.chat:
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint}

    # -- streaming
    def chunk(self, choices: list[dict], usage: dict | None = None) -> dict:
        out = {**self._envelope(True), "choices": choices}
        if self.p.include_usage:
            out["usage"] = usage
        return out

    def opening_chunks(self) -> list[dict]:
        if self.chat:
            return [self.chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}]) for i in range(self.p.n)]
        if self.echo_text:
            return [self.chunk([self._choice(self.echo_text, None, None, True, i)]) for i in range(self.p.n)]
        return []

    def piece_chunk(self, text: str, lps: list[TokenLogprob] | None, index: int = 0) -> dict:
        return self.chunk([self._choice(text, self._logprobs(lps, index), None, True, index)])

    def piece_sse(self, text: str, index: int = 0) -> bytes:
        """``sse(piece_chunk(text, None, index))``, byte for byte, from a template made once per
        choice: only the text is JSON-escaped per token."""
        parts = self._piece_sse.get(index)
        if parts is None:
            parts = self._piece_sse[index] = sse(self.piece_chunk(_PIECE, None, index)).split(_JSON.encode(_PIECE).encode())
        if len(parts) != 2:  # the model id holds the placeholder after all
            return sse(self.piece_chunk(text, None, index))
        return parts[0] + _JSON.encode(text).encode() + parts[1]

    def finish_chunk(self, done: DoneEvent, index: int = 0) -> dict:
        return self.chunk([self._choice(None, None, FINISH_REASONS.get(done.finish_reason, "stop"), True, index)])

    def usage_chunks(self, dones: list[DoneEvent]) -> list[dict]:
        """After every choice's finish chunk: the usage chunk, if the client asked for it."""
        return [self.chunk([], usage_body(dones))] if self.p.include_usage else []

    # -- whole response
    def body(self, texts: list[str], lps: list[list[TokenLogprob]], dones: list[DoneEvent]) -> dict:
        choices = [self._choice(self.echo_text + text, self._logprobs(lp, i), FINISH_REASONS.get(d.finish_reason, "stop"), False, i)
                   for i, (text, lp, d) in enumerate(zip(texts, lps, dones))]
        return {**self._envelope(False), "choices": choices, "usage": usage_body(dones)}
