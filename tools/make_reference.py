"""Produce the expected values the SmolLM2 tests compare against, with an independent
implementation: transformers' own GGUF loading (tokenizer conversion, dequantization to float32,
LlamaForCausalLM on the CPU) and its chat-template rendering.

Run once (transformers and torch are NOT test dependencies):
    pip install torch transformers
    python tools/make_reference.py PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf
Writes tests/data/smollm2_reference.json.
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "smollm2_reference.json"

# Deterministic, varied strings: ASCII prose, code, numbers, accents, CJK, emoji, whitespace
# runs, special tokens in the text, mixed scripts.
_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Hello", "world", "naïve", "café",
          "résumé", "Straße", "façade", "über", "Ångström", "日本語", "中文", "한국어", "東京", "привет", "мир",
          "مرحبا", "שלום", "γειά", "🙂", "🚀", "👍🏽", "🇫🇷", "∑", "∞", "→", "½", "™", "—", "…", "I'm", "don't",
          "we'll", "it's", "they've", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "1234567", "3.14159",
          "0x1F", "1e-9", "$100", "50%", "#tag", "@user", "https://example.com/a?b=c", "e-mail", "C++", "a_b",
          "snake_case", "CamelCase", "ALLCAPS", "tab\there", "new\nline", "  two  spaces", "\t", "\r\n", "   "]
_CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "SELECT name, COUNT(*) FROM users GROUP BY name;",
    "const x = {a: 1, 'b': [2, 3]};",
    "if __name__ == \"__main__\":\n\tmain()",
    "<div class=\"x\">Hi &amp; bye</div>",
    "fn main() { println!(\"{}\", 42); }",
    "    indented\n        more\n",
]


def varied_strings(n: int = 1100) -> list[str]:
    rnd = random.Random(24)
    out = list(_WORDS) + list(_CODE)
    while len(out) < n:
        k = rnd.randint(1, 14)
        parts = []
        for _ in range(k):
            r = rnd.random()
            if r < 0.55:
                parts.append(rnd.choice(_WORDS))
            elif r < 0.65:
                parts.append(rnd.choice(_CODE))
            elif r < 0.8:
                parts.append(str(rnd.randint(0, 10**rnd.randint(1, 9))))
            elif r < 0.9:
                parts.append("".join(chr(rnd.randint(0x20, 0x7E)) for _ in range(rnd.randint(1, 12))))
            else:
                parts.append("".join(chr(rnd.choice([rnd.randint(0xC0, 0x24F), rnd.randint(0x4E00, 0x4FFF), rnd.randint(0x1F600, 0x1F64F)])) for _ in range(rnd.randint(1, 4))))
        sep = rnd.choice([" ", "", "\n", "  ", ", "])
        out.append(sep.join(parts))
    return out


TEMPLATE_CASES = [
    {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": True},
    {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there!"}, {"role": "user", "content": "Tell me a joke. 🙂"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "no prompt"}], "add_generation_prompt": False},
    {"messages": [{"role": "system", "content": "Sys"}, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "add_generation_prompt": False},
]

GREEDY_PROMPTS = [
    {"kind": "chat", "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"kind": "chat", "messages": [{"role": "user", "content": "Write a haiku about the sea."}]},
    {"kind": "chat", "messages": [{"role": "system", "content": "You answer in one sentence."}, {"role": "user", "content": "Why is the sky blue?"}]},
    {"kind": "chat", "messages": [{"role": "user", "content": "List three prime numbers."}]},
    {"kind": "raw", "text": "The quick brown fox"},
    {"kind": "raw", "text": "def fibonacci(n):\n"},
    {"kind": "raw", "text": "Once upon a time, in a land far away,"},
]


def _with_smollm_pretokenizer(tok, strings):
    from tokenizers import pre_tokenizers

    bt = tok.backend_tokenizer
    bt.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    ids = [bt.encode(s, add_special_tokens=False).ids for s in strings]
    return ids


def main(gguf_path: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = Path(gguf_path)
    tok = AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)
    model = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, torch_dtype=torch.float32)
    model.eval()
    strings = varied_strings()
    ref = {
        "model_sha256": None,
        "strings": strings,
        # transformers' conversion as is.  Its table of pre-tokenizer splits has no "smollm" entry,
        # so it splits with plain GPT-2 byte-level regex, while llama.cpp (LLAMA_VOCAB_PRE_TYPE_SMOLLM)
        # and SmolLM2's own tokenizer.json split digits first (Digits(individual_digits) then
        # ByteLevel).  The two differ only where whitespace runs precede a digit ("  9" -> "  ","9"
        # vs " "," 9"); we record both and the tests assert exactly that.
        "ids_transformers_raw": [tok(s, add_special_tokens=False).input_ids for s in strings],
        "ids": _with_smollm_pretokenizer(tok, strings),
        "templates": [dict(c, rendered=tok.apply_chat_template(c["messages"], tokenize=False, add_generation_prompt=c["add_generation_prompt"])) for c in TEMPLATE_CASES],
        "greedy": [],
    }
    for case in GREEDY_PROMPTS:
        text = case["text"] if case["kind"] == "raw" else tok.apply_chat_template(case["messages"], tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False).input_ids
        with torch.no_grad():
            x = torch.tensor([ids])
            logits = model(x).logits[0, -1].double()
            top = torch.topk(logits, 5)
            gen = model.generate(x, max_new_tokens=32, do_sample=False, attention_mask=torch.ones_like(x),
                                 eos_token_id=None, pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else 0)
        ref["greedy"].append(dict(case, prompt_ids=ids, top5_ids=top.indices.tolist(), top5_logits=top.values.tolist(),
                                  greedy32=gen[0, len(ids):].tolist()))
        print(case["kind"], repr(tok.decode(gen[0, len(ids):])), flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(ref, ensure_ascii=False))
    print(f"wrote {OUT} ({len(strings)} strings)")


if __name__ == "__main__":
    main(sys.argv[1])
