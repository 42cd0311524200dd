"""tools/spec_replay.py replays a greedy output through the n-gram drafter instead of running the
model (docs/performance.md cites it for what a draft-length policy can reach at given step costs):
its premise is that greedy verification makes every round a function of the plain output alone,
so its counts must be those of a real speculative run of the same request."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import spec_replay  # noqa: E402

from bw24chat.api import SamplingParams  # noqa: E402
from bw24chat.speculative import NgramDrafter  # noqa: E402


@pytest.fixture(scope="module")
def edit_run(smollm2_path):
    """SmolLM2's greedy reply to the editing request (NumPy backend), and its engine's generator."""
    from bw24chat.engine import open_engine
    from bw24chat.options import EngineOptions

    eng = open_engine(EngineOptions(model=str(smollm2_path), device="cpu", n_ctx=2048, max_batch=1))
    sp = SamplingParams(temperature=0, max_tokens=40, seed=0)
    prompt = spec_replay.edit_prompt(eng)
    out = eng.generator.generate(prompt, sp).token_ids
    assert len(out) == sp.max_tokens  # no stop inside: the replay's cap is the generation's
    yield eng.generator, prompt, sp, out
    eng.close()


@pytest.mark.parametrize("k", [1, 3, 8])
def test_replay_counts_are_a_greedy_speculative_runs(edit_run, k):
    gen, prompt, sp, out = edit_run
    st = gen.generate(prompt, sp, drafter=NgramDrafter(), spec_k=k).stats
    r = spec_replay.replay(prompt, out, lambda m: 1.0 + 0.3 * (m - 1), "fixed", k)
    assert (r["rounds"], r["drafted"], r["accepted"]) == (st["spec_rounds"], st["spec_drafted"], st["spec_accepted"])
    assert st["spec_accepted"] > 0  # the edit prompt gives the drafter something to copy


def test_clairvoyant_verifies_no_rejected_draft_and_bounds_fixed_k(edit_run):
    _, prompt, _, out = edit_run
    flat = lambda m: 1.0  # noqa: E731 - a step of any rows costs one: the speed-up is the tokens per step
    c = spec_replay.replay(prompt, out, flat, "clairvoyant")
    assert c["accepted"] == c["drafted"] > 0
    assert c["speedup"] == pytest.approx((len(out) - 1) / c["steps"])
    assert all(spec_replay.replay(prompt, out, flat, "fixed", k)["speedup"] <= c["speedup"] for k in range(1, 9))


def test_steps_past_the_costs_given_run_as_passes():
    costs = [1.0, 1.5, 2.0]
    assert spec_replay.step_cost(costs, 3, 0.0) == 2.0
    assert spec_replay.step_cost(costs, 4, 0.0) == 3.0  # 3 + 1 rows
    assert spec_replay.step_cost(costs, 8, 0.5) == 2.0 + 2.0 + 1.5 + 0.5
