"""Tokenizers through the `tokenizers` library, from tokenizer.json or from GGUF metadata, and
streaming detokenization that never emits broken UTF-8.

GGUF vocabularies are rebuilt into a ``tokenizers.Tokenizer`` following llama.cpp's reading of
the metadata (llama-vocab.cpp): ``tokenizer.ggml.model`` picks byte-level BPE ("gpt2") or
SentencePiece-style BPE with byte fallback ("llama"); ``tokenizer.ggml.pre`` picks the
pre-tokenizer split; token types 3 (CONTROL) become special added tokens and 4 (USER_DEFINED)
plain added tokens, so they are never split.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

# Pre-tokenizer regexes by llama.cpp pre-type name (llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_*).
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# (splits applied in order; "digits" = each digit its own piece first)
PRE_TOKENIZER_SPLITS: dict[str, list[str]] = {
    "default": [_GPT2_SPLIT],
    "gpt-2": [_GPT2_SPLIT],
    "gpt2": [_GPT2_SPLIT],
    # SmolLM / StarCoder / Refact / Command-R / CodeShell: single digits, then the GPT-2 regex
    "smollm": [r"\p{N}", _GPT2_SPLIT],
    "starcoder": [r"\p{N}", _GPT2_SPLIT],
    "refact": [r"\p{N}", _GPT2_SPLIT],
    "command-r": [r"\p{N}", _GPT2_SPLIT],
    "codeshell": [r"\p{N}", _GPT2_SPLIT],
    "llama3": [_LLAMA3_SPLIT],
    "llama-v3": [_LLAMA3_SPLIT],
    "llama-bpe": [_LLAMA3_SPLIT],
    "smaug-bpe": [_LLAMA3_SPLIT],
    "dbrx": [_LLAMA3_SPLIT],
    "qwen2": [_QWEN2_SPLIT],
    "deepseek-r1-qwen": [_QWEN2_SPLIT],
    "megrez": [_QWEN2_SPLIT],
}

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


def _byte_level_alphabet() -> set[str]:
    return set(pre_tokenizers.ByteLevel.alphabet())


def tokenizer_from_gguf_fields(f: dict) -> Tokenizer:
    """Build a Tokenizer from GGUF ``tokenizer.ggml.*`` fields (keys without that prefix)."""
    kind = f.get("model", "gpt2")
    tokens: list[str] = f["tokens"]
    types: list[int] = f.get("token_type") or [1] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in f.get("merges") or []]
    if kind == "gpt2":
        tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        pre = f.get("pre", "default")
        splits = PRE_TOKENIZER_SPLITS.get(pre)
        if splits is None:
            raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r}; known: {sorted(PRE_TOKENIZER_SPLITS)}")
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(s), behavior="isolated") for s in splits]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        tk.decoder = decoders.ByteLevel()
        alphabet = _byte_level_alphabet()
    elif kind == "llama":
        # SentencePiece BPE: spaces are U+2581, unknown bytes fall back to <0xXX> tokens.
        if not merges:
            merges = _merges_from_scores(tokens, f.get("scores"))
        unk = f.get("unknown_token_id", 0)
        tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=tokens[unk], fuse_unk=True, byte_fallback=True))
        norm = [normalizers.Replace(" ", "\u2581")]
        if f.get("add_space_prefix", True):
            norm.insert(0, normalizers.Prepend("\u2581"))
        tk.normalizer = normalizers.Sequence(norm)
        dec = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
        if f.get("add_space_prefix", True):
            dec.append(decoders.Strip(" ", 1, 0))
        tk.decoder = decoders.Sequence(dec)
        alphabet = None
    else:
        raise ValueError(f"unsupported GGUF tokenizer model {kind!r} (supported: gpt2, llama)")
    specials, plain = [], []
    for t, ty in zip(tokens, types):
        if ty == TOKEN_TYPE_CONTROL and (alphabet is None or set(t) <= alphabet):
            specials.append(AddedToken(t, special=True, normalized=False))
        elif ty == TOKEN_TYPE_USER_DEFINED:
            plain.append(AddedToken(t, special=False, normalized=False))
    if specials:
        tk.add_special_tokens(specials)
    if plain:
        tk.add_tokens(plain)
    return tk


def _merges_from_scores(tokens: list[str], scores: list[float] | None) -> list[tuple[str, str]]:
    """SentencePiece vocabularies list no merges; a merge a+b exists when a, b and ab are all
    tokens, ranked by the score of ab (higher first), as SentencePiece's BPE applies them."""
    vocab = {t: i for i, t in enumerate(tokens)}
    score = (lambda t: scores[vocab[t]]) if scores is not None else (lambda t: -vocab[t])
    found = []
    for tok in tokens:
        for k in range(1, len(tok)):
            a, b = tok[:k], tok[k:]
            if a in vocab and b in vocab:
                found.append((score(tok), vocab[a], vocab[b], a, b))
    found.sort(key=lambda x: (-x[0], x[1], x[2]))
    return [(a, b) for _, _, _, a, b in found]


@dataclass
class TokenizerInfo:
    """The tokenizer plus what generation needs to know about its special tokens."""

    tokenizer: Tokenizer
    bos_id: int | None = None
    eos_id: int | None = None
    stop_ids: set[int] = field(default_factory=set)  # EOS, EOT, <|im_end|>, <|eot_id|>, ...
    add_bos: bool = False
    chat_template: str | None = None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def token(self, i: int | None) -> str | None:
        return None if i is None else self.tokenizer.id_to_token(i)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Text -> ids.  Special tokens written in the text (e.g. from a chat template) are
        recognised as such."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            if not ids or ids[0] != self.bos_id:
                ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special)


# Tokens that end a turn in common chat formats; only used when the vocabulary has them.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<end_of_turn>", "<|end|>", "</s>", "<|eom_id|>")


def collect_stop_ids(tk: Tokenizer, eos_id: int | None, extra: list[int] = ()) -> set[int]:
    ids = {i for i in [eos_id, *extra] if i is not None}
    for t in _END_OF_TURN:
        i = tk.token_to_id(t)
        if i is not None:
            ids.add(i)
    return ids


def load_hf_tokenizer(model_dir: Path, generation_config: dict, cfg: dict) -> TokenizerInfo:
    """From tokenizer.json, with ``cfg`` the folder's tokenizer_config.json ({} when absent)."""
    tk = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def tok_id(v):
        if isinstance(v, dict):
            v = v.get("content")
        return tk.token_to_id(v) if isinstance(v, str) else None

    bos = tok_id(cfg.get("bos_token"))
    eos = tok_id(cfg.get("eos_token"))
    gen_eos = generation_config.get("eos_token_id")
    extra = gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else []
    if eos is None and extra:
        eos = extra[0]
    if bos is None and generation_config.get("bos_token_id") is not None:
        bos = generation_config["bos_token_id"]
    template = cfg.get("chat_template")
    if isinstance(template, list):  # named templates: take "default"
        template = next((t["template"] for t in template if t.get("name") == "default"), template[0]["template"])
    jt = model_dir / "chat_template.jinja"
    if template is None and jt.exists():
        template = jt.read_text(encoding="utf-8")
    add_bos = bool(cfg.get("add_bos_token", False))
    # tokenizer.json post-processors that add BOS are bypassed (add_special_tokens=False); honour them here
    if not add_bos and tk.post_processor is not None and bos is not None:
        add_bos = bos in tk.encode("a", add_special_tokens=True).ids
    return TokenizerInfo(tk, bos, eos, collect_stop_ids(tk, eos, extra), add_bos, template)


class StreamDecoder:
    """Incremental detokenizer.  ``push(id)`` returns the new text, which is always whole
    characters: bytes of a character split over several tokens are held until it completes
    (the decoded tail would end in U+FFFD), and a character is never emitted twice.

    It decodes a short window of recent ids (not the whole history) so each push costs O(1);
    the window starts a few tokens back because SentencePiece decoders treat the first token
    specially (leading-space strip)."""

    def __init__(self, tok: TokenizerInfo, skip_special: bool = True):
        self.tok = tok
        self.skip_special = skip_special
        self.ids: list[int] = []
        self._prefix = 0  # window start
        self._read = 0  # ids before this are already emitted
        self._prefix_text = None  # ids[_prefix:_read] decoded (None: not yet, or the window moved)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix_text = self._prefix_text
        if prefix_text is None:
            prefix_text = self._prefix_text = self.tok.decode(self.ids[self._prefix : self._read], self.skip_special)
        full = self.tok.decode(self.ids[self._prefix :], self.skip_special)
        if full.endswith("\ufffd") or len(full) <= len(prefix_text):
            return ""
        new = full[len(prefix_text) :]
        if self._read - self._prefix > 8:
            self._prefix, self._prefix_text = max(self._read - 4, 0), None
        else:  # the same window: what was just decoded is the next push's prefix
            self._prefix_text = full
        self._read = len(self.ids)
        return new

    def flush(self) -> str:
        """At the end: whatever is still held (an incomplete character decodes as U+FFFD)."""
        prefix_text = self.tok.decode(self.ids[self._prefix : self._read], self.skip_special)
        full = self.tok.decode(self.ids[self._prefix :], self.skip_special)
        self._read, self._prefix_text = len(self.ids), None
        return full[len(prefix_text) :] if len(full) > len(prefix_text) else ""
