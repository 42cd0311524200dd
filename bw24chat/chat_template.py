"""Chat templates (Jinja2) from GGUF ``tokenizer.chat_template`` or tokenizer_config.json.

Templates come from downloaded files, so they are untrusted: they are rendered in jinja2's
``ImmutableSandboxedEnvironment`` (no attribute access to internals, no mutation of passed
objects).  The environment matches what transformers gives templates (trim_blocks,
lstrip_blocks, loopcontrols, ``raise_exception``, ``tojson`` without ASCII escaping,
``strftime_now``), so templates written for it render the same here.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    pass


def _raise(message: str):
    raise ChatTemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compile(source: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
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

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        for m in messages:
            if "role" not in m or "content" not in m:
                raise ChatTemplateError("each message needs 'role' and 'content'")
        try:
            return _compile(self.source).render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                tools=None,
                **extra,
            )
        except ChatTemplateError:
            raise
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc
