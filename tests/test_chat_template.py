"""Chat templates render exactly as transformers renders them; untrusted templates are sandboxed;
models without a template get a clear fallback."""
import pytest

from bw24chat.chat_template import ChatFormatter, ChatTemplateError


def test_renders_like_transformers(smollm2, reference):
    tok = smollm2.tokenizer
    fmt = ChatFormatter(tok.chat_template, tok.token(tok.bos_id), tok.token(tok.eos_id))
    for case in reference["templates"]:
        assert fmt.render(case["messages"], case["add_generation_prompt"]) == case["rendered"]


def test_sandbox_blocks_attribute_escape():
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ChatTemplateError):
        ChatFormatter(evil, None, None).render([{"role": "user", "content": "x"}])


def test_sandbox_blocks_mutation():
    evil = "{% set _ = messages.append({'role': 'x', 'content': 'y'}) %}{{ messages | length }}"
    with pytest.raises(ChatTemplateError):
        ChatFormatter(evil, None, None).render([{"role": "user", "content": "x"}])


def test_raise_exception_reaches_the_user():
    t = "{{ raise_exception('only user/assistant roles') }}"
    with pytest.raises(ChatTemplateError, match="only user/assistant"):
        ChatFormatter(t, None, None).render([{"role": "user", "content": "x"}])


def test_fallbacks_without_template():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    chatml = ChatFormatter(None, None, None, has_chatml=True)
    assert not chatml.has_template
    assert chatml.render(msgs) == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert ChatFormatter(None, None, None).render(msgs) == "S\n\nUser: U\nAssistant:"


def test_multi_turn_and_system(smollm2):
    tok = smollm2.tokenizer
    fmt = ChatFormatter(tok.chat_template, None, None)
    out = fmt.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a"},
                      {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}])
    assert out.count("<|im_start|>") == 5 and "Be brief." in out and out.endswith("<|im_start|>assistant\n")


HOSTILE_TEMPLATES = {
    "python internals": ("{{ messages.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
    "function globals": ("{{ cycler.__init__.__globals__.os.system('echo pwned') }}", "unsafe"),
    "a loop that never ends": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                               "did not finish within"),
    "a huge string": ("{{ 'x' * 10**9 }}", "limit"),
    "a doubling loop": ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                        "more than"),
    "a huge number": ("{{ 10 ** 100000000 }}", "too large"),
    "a wide center": ("{{ 'x'|center(1000000000) }}", "more than"),
    "a growing replace": ("{{ ('a' * 1000)|replace('a', 'b' * 100000) }}", "more than"),
    "a star width": ("{{ '%*s' % (1000000000, 'x') }}", "unbounded width"),
    "a wide format": ("{{ '%1000000000s'|format('x') }}", "more than"),
    "endless recursion": ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "RecursionError"),
    "a syntax error": ("{% for %}", "chat template failed"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_TEMPLATES))
def test_hostile_templates_fail_cleanly_within_limits(case):
    import time

    from bw24chat.chat_template import RENDER_SECONDS, ChatFormatter, ChatTemplateError

    source, fragment = HOSTILE_TEMPLATES[case]
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateError) as info:
        ChatFormatter(source, None, None).render([{"role": "user", "content": "hi"}])
    assert fragment in str(info.value)
    assert time.monotonic() - t0 < RENDER_SECONDS + 1.5


def test_the_limited_filters_still_work():
    src = "{{ 'abc'|replace('b', 'x') }}|{{ 'a\nb'|indent(2, true) }}|{{ 'x'|center(5) }}|{{ '%s-%d'|format('a', 3) }}"
    assert ChatFormatter(src, None, None).render([{"role": "user", "content": "hi"}]) == "axc|  a\n  b|  x  |a-3"
