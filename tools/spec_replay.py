"""What n-gram speculation can gain on the editing workload at given step costs, without a GPU.

Greedy verification accepts the longest draft prefix equal to plain decoding's tokens, so every
round of a drafter is fixed by the plain output alone: one greedy run of the editing workload
(`bw24chat bench --spec ngram`'s request, on the NumPy backend) is replayed through the n-gram
drafter (speculative.NgramDrafter) at each draft length, through the adaptive length
(speculative.DraftLength, as generate.py drives it, with the given costs learnt from the start),
and through a clairvoyant length (each round drafts exactly the prefix of the drafter's 8-token
proposal that will be accepted: no rejected draft is ever verified).  The clairvoyant row bounds
what any draft-length policy over these proposals can reach at these step costs.

    python tools/spec_replay.py --costs 0.621,0.810,0.999,1.188,1.434,1.680,1.925,2.171 \
        [-m MODEL] [--max-tokens 160] [--round-ms 0.02]

--costs: the wall time in ms of a decode step of m = 1, 2, ... rows (bench's step{m}@512 rows);
steps of more rows than given run as passes of the largest m given plus the rest, as the runner does.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def edit_prompt(engine) -> list[int]:
    """The editing request's prompt ids on an engine (its chat template and tokenizer)."""
    from bw24chat.bench import edit_messages

    return list(engine.tokenizer.encode(engine.render_prompt(edit_messages())))


def greedy_edit(model: str, max_tokens: int) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy output ids) of the editing request on the NumPy backend."""
    from bw24chat.api import SamplingParams
    from bw24chat.engine import open_engine
    from bw24chat.options import EngineOptions

    eng = open_engine(EngineOptions(model=model, device="cpu", n_ctx=2048, max_batch=1))
    try:
        ids = edit_prompt(eng)
        return ids, list(eng.generator.generate(ids, SamplingParams(temperature=0, max_tokens=max_tokens, seed=0)).token_ids)
    finally:
        eng.close()


def step_cost(costs: list[float], m: int, round_ms: float) -> float:
    """ms of a verify round of m rows: passes of len(costs) rows at most, plus the host's round."""
    P, t = len(costs), 0.0
    while m > 0:
        t += costs[min(m, P) - 1]
        m -= P
    return t + round_ms


def replay(prompt: list[int], out: list[int], cost, policy: str, k: int = 0) -> dict:
    """One policy over the plain greedy output ``out`` of ``prompt``: "fixed" (k drafts), "auto"
    (DraftLength, one class), "class" (DraftLength per n-gram match length, as generate.py drives
    it), "clairvoyant".  Returns the speed-up over plain decoding at ``cost(rows)`` ms a step, the
    steps taken, and the verify rounds, drafts and accepted drafts (SpecCounters' counts)."""
    from bw24chat.speculative import MAX_K, DraftLength, NgramDrafter, SpecCounters, StepCosts

    costs = StepCosts()
    for m in range(1, MAX_K + 2):  # the step times known from the start
        for _ in range(3):
            costs.observe(m, cost(m) * 1e-3)
    drafter, dl, spec = NgramDrafter(), DraftLength(k if policy == "fixed" else 0, costs), SpecCounters()
    drafter.begin(prompt)
    hist, i, t, steps = list(prompt) + [out[0]], 1, 0.0, 0
    while i < len(out):
        left = len(out) - i - 1  # drafts + the bonus never run past the output (generate.py's cap)
        if policy == "clairvoyant":
            n = min(MAX_K, left)
        else:
            dl.use(drafter.confidence(hist) if policy == "class" else 0)
            n = min(dl.choose(), left)
        drafts = drafter.propose(hist, n) if n > 0 else []
        acc = 0
        while acc < len(drafts) and drafts[acc] == out[i + acc]:
            acc += 1
        if policy == "clairvoyant":
            drafts = drafts[:acc]
        if drafts:
            spec.add(len(drafts), acc)
            dl.update(len(drafts), acc)
        t += cost(1 + len(drafts))
        steps += 1
        hist += out[i:i + acc + 1]
        i += acc + 1
    return dict(speedup=cost(1) * (len(out) - 1) / t, steps=steps, rounds=spec.rounds, drafted=spec.drafted,
                accepted=spec.accepted)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--costs", required=True, help="ms of a decode step of m = 1, 2, ... rows, comma-separated")
    p.add_argument("-m", "--model", default="default")
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--round-ms", type=float, default=0.02, help="host time a round adds to its step (ms)")
    p.add_argument("--cache", metavar="JSON", help="keep the greedy run here (read it when it exists)")
    a = p.parse_args(argv)
    costs = [float(c) for c in a.costs.split(",")]
    if a.cache and Path(a.cache).exists():
        d = json.loads(Path(a.cache).read_text())
        prompt, out = d["prompt"], d["out"][:a.max_tokens]
    else:
        prompt, out = greedy_edit(a.model, a.max_tokens)
        if a.cache:
            Path(a.cache).write_text(json.dumps({"prompt": prompt, "out": out}))
    cost = lambda m: step_cost(costs, m, a.round_ms)  # noqa: E731
    print(f"editing workload: {len(prompt)} prompt tokens, {len(out)} greedy tokens; steps "
          + ", ".join(f"{c:.3f}" for c in costs) + f" ms at m = 1..{len(costs)}, +{a.round_ms} ms a round")
    print(f"{'policy':12} {'K':>3} {'speed-up':>8} {'drafts/step':>11} {'tokens/step':>11} {'accepted':>8}")
    rows = [("fixed", k) for k in range(1, 9)] + [("auto", 0), ("class", 0), ("clairvoyant", 0)]
    for policy, k in rows:
        r = replay(prompt, out, cost, policy, k)
        acc = f"{100 * r['accepted'] / r['drafted']:7.0f}%" if r["drafted"] else f"{'-':>8}"
        print(f"{policy:12} {k if policy == 'fixed' else '-':>3} {r['speedup']:8.2f} {r['drafted'] / r['steps']:11.2f} "
              f"{(len(out) - 1) / r['steps']:11.2f} {acc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
