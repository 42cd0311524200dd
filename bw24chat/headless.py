"""``bw24chat --headless``: scripting without the TUI, on the same engine.

One-shot: the prompt comes from the argument or stdin (one trailing newline dropped: ``echo``
and here-strings add it, and it changes the answer); the reply streams to stdout (or, with
--json, JSON lines: {"type": "text", "text": ...} records, then one {"type": "done", ...} record
with token counts, time to first token, prefill/decode tokens/s and the sampling values used;
with --spec also the speculative counters spec_rounds, spec_drafted, spec_accepted, spec_acceptance, spec_mean_len).
Multi-turn (--multi-turn): JSON lines in, JSON lines out.  Each input line is
{"role": "user", "content": "..."} (appended to the conversation and answered),
{"role": "system", "content": "..."} (sets the system prompt), or {"command": "reset"}.
"""
from __future__ import annotations

import json
import signal
import sys
import threading

from .api import DoneEvent, ErrorEvent, GenerationRequest, TokenEvent
from .sampling_defaults import effective_sampling, sampling_summary


class _CtrlC:
    """While a reply streams, the first Ctrl-C cancels it (the engine stops at its next step and
    the stream ends as usual, with finish_reason "cancelled", so what is printed is whole); a
    second one interrupts at once.  Only the main thread can take signals."""

    def __init__(self, handle):
        self.handle = handle
        self.pressed = False

    def _on_sigint(self, signum, frame):
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True
        self.handle.cancel()

    def __enter__(self):
        main = threading.current_thread() is threading.main_thread()
        self.previous = signal.signal(signal.SIGINT, self._on_sigint) if main else None
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _run(engine, request: GenerationRequest, as_json: bool, out=None) -> tuple[str, DoneEvent | ErrorEvent]:
    """Stream one reply; raises KeyboardInterrupt after printing it whole if Ctrl-C cut it short."""
    out = out or sys.stdout  # looked up per call: whoever redirected sys.stdout meant it
    text = []
    final = None
    handle = engine.submit(request)
    with _CtrlC(handle) as ctrl_c:
        for ev in handle.events():
            if isinstance(ev, TokenEvent) and ev.text:
                text.append(ev.text)
                out.write(json.dumps({"type": "text", "text": ev.text}, ensure_ascii=False) + "\n" if as_json else ev.text)
                out.flush()
            elif isinstance(ev, (DoneEvent, ErrorEvent)):
                final = ev
    _finish(final, request, as_json, out)
    if ctrl_c.pressed:
        sys.stderr.write("bw24chat: interrupted\n")
        raise KeyboardInterrupt
    return "".join(text), final


def _finish(final: DoneEvent | ErrorEvent, request: GenerationRequest, as_json: bool, out) -> None:
    """The closing record (JSON) or newline, or the error."""
    if isinstance(final, DoneEvent):
        s = final.stats
        rec = {
            "type": "done",
            "finish_reason": final.finish_reason,
            "prompt_tokens": final.usage.prompt_tokens,
            "generated_tokens": final.usage.completion_tokens,
            "cached_tokens": s.get("cached_tokens", 0),
            "ttft_s": round(s.get("ttft_s", 0.0), 4),
            "prefill_tps": round(s.get("prefill_tps", 0.0), 2),
            "decode_tps": round(s.get("decode_tps", 0.0), 2),
            "seed": s.get("seed"),
            "backend": s.get("backend"),
            "sampling": sampling_summary(request.sampling),
        }
        rec.update({k: round(v, 4) for k, v in s.items() if k.startswith("spec_")})  # speculative decoding's counters
        if as_json:
            out.write(json.dumps(rec) + "\n")
        else:
            out.write("\n")
            if final.finish_reason == "context_full":
                sys.stderr.write("[context full: the reply was cut at the model's context length]\n")
            elif final.finish_reason == "loop":
                sys.stderr.write(f"[stopped: the reply repeated itself for {request.sampling.stop_on_loop} tokens (--stop-on-loop)]\n")
    else:
        if as_json:
            out.write(json.dumps({"type": "error", "message": final.message}) + "\n")
        else:
            sys.stderr.write(f"bw24chat: {final.message}\n")
    out.flush()


def read_prompt(text: str) -> str:
    """stdin's prompt without the one newline that ends a line of input."""
    return text.removesuffix("\n").removesuffix("\r")


def run_headless(engine, args, options) -> int:
    """Exit status: 0 done, 1 the generation failed, 2 bad input, 130 interrupted (Ctrl-C)."""
    try:
        return _headless(engine, args, options)
    except KeyboardInterrupt:
        return 130


def _headless(engine, args, options) -> int:
    info = engine.info
    sampling = effective_sampling(options.sampling, options.sampling_set, info.sampling_defaults)
    if info.sampling_source and not args.json:
        summary = ", ".join(f"{k} {v}" for k, v in sampling_summary(sampling).items())
        sys.stderr.write(f"bw24chat: sampling {summary} ({info.sampling_source} unless set by a flag)\n")
    if args.multi_turn:
        return _multi_turn(engine, args, sampling)
    prompt = args.prompt if args.prompt is not None else read_prompt(sys.stdin.read())
    if not prompt.strip():
        sys.stderr.write("bw24chat: empty prompt (give it as an argument or on stdin)\n")
        return 2
    if args.raw:
        req = GenerationRequest(prompt=prompt, sampling=sampling)
    else:
        msgs = ([{"role": "system", "content": args.system}] if args.system else []) + [{"role": "user", "content": prompt}]
        req = GenerationRequest(messages=msgs, sampling=sampling)
    _, final = _run(engine, req, args.json)
    return 0 if isinstance(final, DoneEvent) else 1


def _multi_turn(engine, args, sampling) -> int:
    system = args.system
    history: list[dict] = []
    status = 0
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except json.JSONDecodeError as exc:
            print(json.dumps({"type": "error", "message": f"bad JSON line: {exc}"}), flush=True)
            status = 1
            continue
        if msg.get("command") == "reset":
            history = []
            print(json.dumps({"type": "reset"}), flush=True)
            continue
        if msg.get("role") == "system":
            system = msg.get("content", "")
            continue
        if msg.get("role") != "user" or not isinstance(msg.get("content"), str):
            print(json.dumps({"type": "error", "message": "expected {\"role\": \"user\", \"content\": \"...\"}"}), flush=True)
            status = 1
            continue
        history.append({"role": "user", "content": msg["content"]})
        msgs = ([{"role": "system", "content": system}] if system else []) + history
        text, final = _run(engine, GenerationRequest(messages=msgs, sampling=sampling), True)
        if isinstance(final, DoneEvent):
            history.append({"role": "assistant", "content": text})
        else:
            history.pop()
            status = 1
    return status
