"""Byte-mutation fuzzing of model files, shared by the test suite (bounded runs) and
``tools/fuzz_models.py`` (long runs).

A trial writes a mutated copy of a valid file, loads it with ``load_checkpoint`` and, when that
succeeds, builds the NumPy model and runs two tokens through it.  The only acceptable outcomes
are success and :class:`ModelFileError`; anything else (another exception, a run past the time
limit, an allocation out of proportion to the file) is a failure.  Outcomes are counted by
message class: the message with the path, numbers and quoted names taken out.
"""
from __future__ import annotations

import json
import random
import re
import shutil
import signal
import time
import tracemalloc
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bw24chat.loaders import ModelFileError, load_checkpoint

# Values that break length and count fields: zero, one, sign bits, all ones, just past 2^32.
INTERESTING_U64 = [0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 32, (1 << 63) - 1,
                   1 << 63, (1 << 64) - 1, 10**15]
HANG_SECONDS = 10.0
ALLOC_FACTOR = 64  # peak Python/NumPy allocation while loading, per byte of the file
ALLOC_SLACK = 32 << 20


class Hang(Exception):
    pass


def mutate(data: bytes, rng: random.Random, hot: int) -> bytes:
    """One to four random mutations; most land in ``data[:hot]`` (the header), where lengths,
    counts, offsets and types live."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not buf:
            break
        pos = rng.randrange(min(hot, len(buf)) if rng.random() < 0.8 else len(buf))
        op = rng.randrange(7)
        if op == 0:  # flip a bit
            buf[pos] ^= 1 << rng.randrange(8)
        elif op == 1:  # an interesting little-endian integer over 4 or 8 bytes
            width = rng.choice((4, 8))
            v = rng.choice(INTERESTING_U64) & ((1 << 8 * width) - 1)
            buf[pos : pos + width] = v.to_bytes(width, "little")
        elif op == 2:  # truncate
            del buf[pos:]
        elif op == 3:  # delete a short range
            del buf[pos : pos + rng.randint(1, 16)]
        elif op == 4:  # insert random bytes
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 5:  # a random byte
            buf[pos] = rng.randrange(256)
        elif op == 6 and len(buf) > 8:  # copy a chunk over another (duplicated names, offsets)
            src = rng.randrange(len(buf) - 8)
            n = rng.randint(1, 64)
            buf[pos : pos + n] = buf[src : src + n]
    return bytes(buf)


def mutate_json(text: str, rng: random.Random) -> str:
    """A config.json that lies: one value replaced by a wrong type, sign or size."""
    data = json.loads(text)
    key = rng.choice(sorted(data))
    data[key] = rng.choice([None, -1, 0, 1, 2**40, 1e308, float("nan"), "x", [], {}, True, [1, 2], "LlamaForCausalLM",
                            {"rope_type": "yarn", "factor": "x"}, data[key]])
    if rng.random() < 0.3:
        data[rng.choice(sorted(data))] = rng.choice([0, 3, 4096, 10**9])
    return json.dumps(data)


_NUMBER = re.compile(r"(?<![\w.])(?<!UTF-)\d+(\.\d+)?(e[-+]?\d+)?")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|b'[^']*'")
# where-names the reader and checks use themselves (not metadata keys of the file)
_STRUCTURE = re.compile(r"^(|tensor T|metadata key #N|metadata_kv_count.*|tensor_count.*|version|tokenizer|tokenizer\.ggml|"
                        r"general\.alignment)$")


def message_class(exc: ModelFileError, known_keys: set[str] | None = None) -> str:
    """The message with the path, numbers, quoted text, tensor names and the bad values taken
    out; a field name that mutation garbled (not one of ``known_keys``) becomes one class."""
    where = re.sub(r"\[\d+\]", "[i]", exc.where)
    where = re.sub(r"^tensor .*", "tensor T", where)
    where = _NUMBER.sub("N", where)
    if known_keys is not None and not _STRUCTURE.match(where) and where.replace("[i]", "") not in known_keys:
        where = "(a garbled key)"
    detail = re.sub(r"^not valid JSON \(.*\)$", "not valid JSON (…)", exc.detail)
    detail = re.sub(r"^.*? (is not a|does not give)", r"V \1", detail)  # the bad value itself
    detail = re.sub(r"(overlaps tensor|tensors bw24chat has no use for:) .*?( \(|$)", r"\1 T\2", detail)
    detail = _QUOTED.sub("'…'", _NUMBER.sub("N", detail))
    return f"{where}: {detail}" if where else detail


@dataclass
class Tally:
    trials: int = 0
    ok: int = 0
    errors: Counter = field(default_factory=Counter)  # message class -> count
    failures: list[str] = field(default_factory=list)  # crashes, hangs, allocations
    known_keys: set[str] | None = None  # the metadata keys of the file being mutated
    slowest: tuple[float, str] = (0.0, "")  # seconds, trial
    peak_alloc: tuple[int, int] = (0, 0)  # (bytes allocated while loading, file bytes) of the largest

    def as_dict(self) -> dict:
        return {"trials": self.trials, "loaded": self.ok, "model_file_errors": sum(self.errors.values()),
                "distinct_errors": len(self.errors), "failures": self.failures, "slowest_s": round(self.slowest[0], 3), "slowest_trial": self.slowest[1],
                "peak_alloc_bytes_and_file_bytes": list(self.peak_alloc),
                "errors": dict(self.errors.most_common())}


def _alarm(signum, frame):
    raise Hang()


def try_load(path: Path, tally: Tally, label: str, use_model: bool = True, hang_s: float = HANG_SECONDS) -> None:
    """One trial on the files at ``path`` (a GGUF or a model folder); ``hang_s``: how long a
    load may take before it counts as a hang (tracemalloc makes loading several times slower)."""
    from bw24chat.backends.numpy_backend import numpy_runner

    size = sum(p.stat().st_size for p in ([path] if path.is_file() else path.iterdir()))
    tally.trials += 1
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, hang_s)
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        ck = load_checkpoint(path)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        if use_model:
            with np.errstate(all="ignore"):  # mutated weights may well be NaN: not this test's business
                runner = numpy_runner(ck)
                ids = (ck.tokenizer.encode("hi") or [0])[: min(2, runner.n_ctx)]  # the engine refuses more than n_ctx
                runner.forward(np.array(ids), 0)
        tally.ok += 1
    except ModelFileError as exc:
        _, peak = tracemalloc.get_traced_memory()
        tally.errors[message_class(exc, tally.known_keys)] += 1
    except Hang:
        peak = 0
        tally.failures.append(f"{label}: no answer within {hang_s} s")
    except Exception as exc:  # noqa: BLE001 - the very thing being counted
        peak = 0
        tally.failures.append(f"{label}: {type(exc).__name__}: {exc}"[:300])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    tally.slowest = max(tally.slowest, (time.perf_counter() - t0, label))
    tally.peak_alloc = max(tally.peak_alloc, (peak, size))
    if peak > ALLOC_FACTOR * size + ALLOC_SLACK:
        tally.failures.append(f"{label}: allocated {peak} bytes while loading a {size}-byte model")


def fuzz_gguf(original: Path, work: Path, trials: int, seed: int, tally: Tally | None = None,
              use_model: bool = True, hang_s: float = HANG_SECONDS) -> Tally:
    """Mutated copies of a GGUF file; the header (up to the tensor data) takes most mutations."""
    from bw24chat.loaders.gguf_reader import GGUFFile

    tally = tally or Tally()
    data = original.read_bytes()
    gf = GGUFFile(original)
    hot, tally.known_keys = gf.data_offset, set(gf.fields)
    rng = random.Random(seed)
    target = work / "fuzz.gguf"
    for i in range(trials):
        target.write_bytes(mutate(data, rng, hot))
        try_load(target, tally, f"{original.name} seed {seed} trial {i}", use_model, hang_s)
    return tally


def fuzz_hf_dir(original: Path, work: Path, trials: int, seed: int, tally: Tally | None = None) -> Tally:
    """Mutated copies of a model folder: the safetensors file (mostly its JSON header), or
    config.json made to lie, or tokenizer.json / tokenizer_config.json broken."""
    tally = tally or Tally()
    rng = random.Random(seed)
    target = work / "fuzz-model"
    weights = (original / "model.safetensors").read_bytes()
    hot = 8 + int.from_bytes(weights[:8], "little")
    for i in range(trials):
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(original, target)
        which = rng.random()
        if which < 0.6:
            (target / "model.safetensors").write_bytes(mutate(weights, rng, hot))
        elif which < 0.9:
            (target / "config.json").write_text(mutate_json((original / "config.json").read_text(), rng))
        else:
            name = rng.choice(["tokenizer.json", "tokenizer_config.json"])
            raw = (original / name).read_bytes()
            (target / name).write_bytes(mutate(raw, rng, len(raw)))
        try_load(target, tally, f"{original.name} seed {seed} trial {i}")
    return tally
