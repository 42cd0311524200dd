"""Chat templates (Jinja2) from GGUF ``tokenizer.chat_template`` or tokenizer_config.json.

Templates come from downloaded files, so they are untrusted: they are rendered in jinja2's
``ImmutableSandboxedEnvironment`` (no attribute access to internals, no mutation of passed
objects), with limits the sandbox lacks: a render stops after ``RENDER_SECONDS`` (a line
tracer on the template's own frames), and no string or list it builds may exceed
``MAX_TEXT`` items (``*``, ``**``, ``+``, ``%`` and the widening filters are checked before
they run).  The environment matches what transformers gives templates (trim_blocks,
lstrip_blocks, loopcontrols, ``raise_exception``, ``tojson`` without ASCII escaping,
``strftime_now``), so templates written for it render the same here.
"""
from __future__ import annotations

import functools
import json
import re
import sys
import time
from datetime import datetime
from functools import lru_cache

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    pass


RENDER_SECONDS = 2.0
MAX_TEXT = 1 << 20  # characters (or list items) any one value of a render may hold
_FORMAT_WIDTH = re.compile(r"%[-#0 +]*(\*|\d{7,})")  # "%*s" or a width of a million or more


def _sized(v) -> int | None:
    return len(v) if isinstance(v, (str, list, tuple)) else None


class _LimitedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox plus size checks on the operators that can grow a value without bound."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if _sized(seq) is not None and isinstance(n, int) and _sized(seq) * n > MAX_TEXT:
                    raise ChatTemplateError(f"the chat template builds a value of {_sized(seq) * n} items (limit {MAX_TEXT})")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int):
            if right > 0 and abs(left) > 1 and abs(left).bit_length() * right > 64 * MAX_TEXT:
                raise ChatTemplateError("the chat template computes a number too large to hold")
        elif operator == "+" and _sized(left) is not None and _sized(right) is not None:
            if _sized(left) + _sized(right) > MAX_TEXT:
                raise ChatTemplateError(f"the chat template builds a value of more than {MAX_TEXT} items")
        elif operator == "%" and isinstance(left, str) and _FORMAT_WIDTH.search(left):
            raise ChatTemplateError("the chat template formats with an unbounded width")
        return super().call_binop(context, operator, left, right)


def _bounded(filter_fn, grows):
    """``filter_fn`` refusing calls whose result ``grows(value, *args)`` would exceed MAX_TEXT.
    functools.wraps keeps jinja's pass_eval_context mark, so jinja still passes the context
    first to the filters that take it."""
    takes_context = hasattr(filter_fn, "jinja_pass_arg")

    @functools.wraps(filter_fn)
    def run(*args, **kwargs):
        if grows(*args[takes_context:], **kwargs) > MAX_TEXT:
            raise ChatTemplateError(f"the chat template builds a value of more than {MAX_TEXT} characters")
        return filter_fn(*args, **kwargs)

    return run


def _width(value, width=80, *args, **kwargs) -> int:
    """center(width) and indent(width): the width is spaces or (indent) a string, per line."""
    per_line = width if isinstance(width, int) else len(width) if isinstance(width, str) else 0
    return len(str(value)) + per_line * (str(value).count("\n") + 1)


def _replaced(value, old="", new="", *args, **kwargs) -> int:
    s, old, new = str(value), str(old), str(new)
    return len(s) + (s.count(old) if old else len(s) + 1) * len(new)


def _raise(message: str):
    raise ChatTemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compile(source: str):
    env = _LimitedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    for name in ("center", "indent"):
        env.filters[name] = _bounded(env.filters[name], _width)
    env.filters["replace"] = _bounded(env.filters["replace"], _replaced)
    env.filters["format"] = _bounded(env.filters["format"], lambda v, *a, **k: MAX_TEXT + 1 if _FORMAT_WIDTH.search(str(v)) else 0)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


# Used when a model ships no template: ChatML if the vocabulary has its markers, otherwise a
# plain transcript that base models continue sensibly.  Either way the UI says so (ModelInfo).
CHATML_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
PLAIN_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] + '\n\n' }}"
    "{% else %}{{ m['role'] | capitalize + ': ' + m['content'] + '\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


class ChatFormatter:
    def __init__(self, template: str | None, bos_token: str | None, eos_token: str | None, has_chatml: bool = False):
        self.has_template = template is not None
        self.source = template if template is not None else (CHATML_TEMPLATE if has_chatml else PLAIN_TEMPLATE)
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""

    @classmethod
    def for_tokenizer(cls, tok) -> "ChatFormatter":
        """The formatter of a model's tokenizer (loaders' TokenizerInfo): its template, else ChatML
        where the vocabulary has the markers, else plain text."""
        return cls(tok.chat_template, tok.token(tok.bos_id), tok.token(tok.eos_id),
                   has_chatml=tok.tokenizer.token_to_id("<|im_start|>") is not None)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        for m in messages:
            if "role" not in m or "content" not in m:
                raise ChatTemplateError("each message needs 'role' and 'content'")
        try:
            template = _compile(self.source)
            with _deadline(RENDER_SECONDS):
                text = template.render(
                    messages=messages,
                    add_generation_prompt=add_generation_prompt,
                    bos_token=self.bos_token,
                    eos_token=self.eos_token,
                    tools=None,
                    **extra,
                )
        except ChatTemplateError:
            raise
        except (TemplateError, ArithmeticError, RecursionError, MemoryError, TypeError, ValueError) as exc:
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
        if len(text) > MAX_TEXT:
            raise ChatTemplateError(f"the chat template rendered {len(text)} characters (limit {MAX_TEXT})")
        return text


class _deadline:
    """Raise ChatTemplateError in this thread once ``seconds`` have passed while template code
    runs (jinja compiles templates to Python code whose file name is "<template>"; only those
    frames are traced, so the cost stays with the template)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def _line(self, frame, event, arg):
        if time.monotonic() > self.end:
            raise ChatTemplateError(f"the chat template did not finish within {self.seconds:g} s")
        return self._line

    def _call(self, frame, event, arg):
        return self._line if frame.f_code.co_filename == "<template>" else None

    def __enter__(self):
        self.end = time.monotonic() + self.seconds
        self.previous = sys.gettrace()
        sys.settrace(self._call)

    def __exit__(self, *exc):
        sys.settrace(self.previous)
