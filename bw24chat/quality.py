"""``bw24chat quality``: what a weight format costs, measured on the model itself.

Baseline: the model's own weights dequantized and rounded to BF16.  For each format the BF16
baseline is re-quantized at load (quantize.py) and run on the same fixed text with the NumPy
reference backend, activations quantized where the CUDA engine quantizes them (the integer-dot
formats, kernel_refs.act_q8), so the cost shown is the cost a GPU user pays.  Reported per
format: mean KL divergence KL(baseline || format) of the next-token distributions over every
position, perplexity of the text, and the bytes of the re-encoded matrices.  Q4_K is listed only where every matrix row is a multiple of 256 values.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys

import numpy as np

FIXED_TEXT = (
    "The lighthouse stood at the end of a narrow spit of rock, and for most of the year the keeper "
    "saw no one but the supply boat that came every second Tuesday. He kept a log in a green ledger: "
    "the wind, the state of the sea, the ships that passed and the hours the lamp burned. In winter the "
    "storms came from the north-west and the spray reached the gallery windows, sixty feet above the "
    "water. He had learned to sleep through the noise, but not through silence; when the wind dropped "
    "suddenly he woke and climbed the stairs to check the lamp. Over the years he taught himself to "
    "repair the clockwork that turned the lens, to bake bread in the small iron stove, and to read the "
    "weather from the colour of the sky at dawn. Visitors asked whether he was lonely. He said that the "
    "sea was never the same twice, and that a man who watches something closely is rarely alone. When "
    "the lamp was finally automated, he moved to the village on the mainland, where he still walks to "
    "the harbour each morning to look at the horizon before anyone else is awake."
)


def _log_probs(ck, ids):
    from .backends.numpy_backend import NumpyBackend, numpy_runner

    r = numpy_runner(ck, backend=NumpyBackend(act_quant=True))  # the engine's numbers: integer-dot formats quantize x
    logits = r.prefill_logits(np.asarray(ids), 0).astype(np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def evaluate(ck, formats: list[str], text: str = FIXED_TEXT) -> list[dict]:
    from .quantize import requantize_checkpoint

    ids = ck.tokenizer.encode(text)
    base_ck = requantize_checkpoint(_clone(ck), "bf16")
    base = _log_probs(base_ck, ids)
    nll = -base[np.arange(len(ids) - 1), ids[1:]]
    rows = [dict(format="bf16 (baseline)", kl_mean=0.0, ppl=float(np.exp(nll.mean())), matrix_bytes=_matrix_bytes(base_ck))]
    for fmt in formats:
        if fmt == "q4_k":
            rows.append(dict(format="q4_k", skipped="no Q4_K quantizer (gguf has none) and rows must be multiples of 256"))
            continue
        qck = requantize_checkpoint(_clone(base_ck), fmt)
        lp = _log_probs(qck, ids)
        kl = (np.exp(base) * (base - lp)).sum(axis=1)
        nll = -lp[np.arange(len(ids) - 1), ids[1:]]
        rows.append(dict(format=fmt, kl_mean=float(kl.mean()), kl_p99=float(np.quantile(kl, 0.99)), ppl=float(np.exp(nll.mean())),
                         top1_agree=float((lp.argmax(1) == base.argmax(1)).mean()), matrix_bytes=_matrix_bytes(qck)))
    return rows


def _clone(ck):
    c = copy.copy(ck)
    c.tensors = dict(ck.tensors)
    return c


def _matrix_bytes(ck) -> int:
    return sum(t.nbytes for t in ck.tensors.values() if len(t.shape) == 2)


QUALITY_FORMATS = ("nvfp4", "q8_0", "q4_k")


def build_parser() -> argparse.ArgumentParser:
    from .options import add_model_arg, comma_list, parser

    p = parser("bw24chat quality", __doc__)
    add_model_arg(p, default="default")
    p.add_argument("--formats", type=comma_list(QUALITY_FORMATS), default=",".join(QUALITY_FORMATS),
                   help="comma list of the formats re-quantized and compared: " + ", ".join(QUALITY_FORMATS))
    return p


def main(argv: list[str]) -> int:
    from .console import print_downloads
    from .model_store import open_checkpoint

    a = build_parser().parse_args(argv)
    ck = open_checkpoint(a.model, print_downloads("bw24chat quality"))
    rows = evaluate(ck, a.formats)
    print(json.dumps(rows, indent=1))
    print(f"\n{ck.name}: {len(ck.tokenizer.encode(FIXED_TEXT))} tokens of fixed text, NumPy backend")
    print(f"{'format':16} {'mean KL':>10} {'p99 KL':>10} {'top-1 agree':>12} {'perplexity':>11} {'matrix MB':>10}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['format']:16} skipped: {r['skipped']}")
            continue
        print(f"{r['format']:16} {r['kl_mean']:10.5f} {r.get('kl_p99', 0):10.5f} {r.get('top1_agree', 1):12.3f} {r['ppl']:11.3f} {r['matrix_bytes'] / 1e6:10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
