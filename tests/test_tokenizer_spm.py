"""SentencePiece-style (llama) GGUF vocabularies: BPE merges recovered from the scores, the
U+2581 space, the leading-space prefix, byte fallback for characters the vocabulary lacks, and
control tokens kept whole."""
from bw24chat.tokenizer import StreamDecoder, TokenizerInfo, tokenizer_from_gguf_fields

# A tiny llama-style vocabulary: <unk>, <s>, </s>, 256 byte tokens, then pieces with scores
# (higher score = merged earlier, as SentencePiece BPE ranks them).
PIECES = [("\u2581", -1.0), ("h", -2.0), ("e", -2.0), ("l", -2.0), ("o", -2.0), ("w", -2.0), ("r", -2.0), ("d", -2.0),
          ("ll", -3.0), ("\u2581h", -3.5), ("he", -4.0), ("\u2581he", -5.0), ("llo", -6.0), ("\u2581hello", -7.0),
          ("\u2581w", -8.0), ("or", -9.0), ("\u2581wor", -10.0), ("\u2581world", -11.0), ("ld", -12.0)]


def _fields(add_space_prefix=True):
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [p for p, _ in PIECES]
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [s for _, s in PIECES]
    types = [2, 3, 3] + [6] * 256 + [1] * len(PIECES)  # UNKNOWN, CONTROL, CONTROL, BYTE, NORMAL
    return {"model": "llama", "tokens": tokens, "scores": scores, "token_type": types, "bos_token_id": 1,
            "eos_token_id": 2, "unknown_token_id": 0, "add_space_prefix": add_space_prefix}


def _tok():
    f = _fields()
    return TokenizerInfo(tokenizer_from_gguf_fields(f), bos_id=1, eos_id=2, stop_ids={2}, add_bos=True), f["tokens"]


def test_merges_from_scores_and_space_prefix():
    tok, vocab = _tok()
    ids = tok.encode("hello world")
    assert [vocab[i] for i in ids] == ["<s>", "\u2581hello", "\u2581world"]
    assert tok.decode(ids) == "hello world"


def test_byte_fallback_round_trips_unknown_characters():
    tok, vocab = _tok()
    ids = tok.encode("hé 🙂", add_bos=False)
    assert any(vocab[i].startswith("<0x") for i in ids)  # é and the emoji are spelled as UTF-8 bytes
    assert tok.decode(ids) == "hé 🙂"
    dec = StreamDecoder(tok)
    pieces = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == "hé 🙂" and all("\ufffd" not in p for p in pieces)


def test_control_tokens_are_never_split():
    tok, vocab = _tok()
    ids = tok.encode("hello</s>world", add_bos=False)
    assert 2 in ids and tok.decode(ids, skip_special=False).replace(" ", "") == "hello</s>world"
