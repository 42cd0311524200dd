"""The memory accounting of batched decoding's paged KV pool, without a GPU: the pool takes what is
left after the weights, the context's cache and the engine's reserve (cuda_budget.pool_room,
engine.pool_plan), as many blocks as fit up to the wanted size; where not even one context fits
the engine serves one request at a time and says why with the numbers, never crashes; a pool
whose creation runs out of memory anyway falls back the same way; --max-batch 1 makes no pool."""
import pytest

from bw24chat.api import GenerationRequest, SamplingParams
from bw24chat.backends.cuda_budget import RESERVE_BYTES, fit_context, kv_token_bytes, pool_room
from bw24chat.backends.numpy_backend import numpy_runner
from bw24chat.check import SPEC_SHAPE, word_tokenizer
from bw24chat.engine import Engine, pool_plan
from bw24chat.kv_pages import KV_POOL_BYTES, min_pool_blocks, pool_blocks
from bw24chat.synthetic import synthetic_checkpoint

GIB = 2**30
BS = 64  # the CUDA runner's block (cuda_ops.KV_PAGE)


def test_the_wanted_pool_is_1_gib_or_kv_pool_and_at_least_one_context():
    small, large = 64 * 1024, 64 * 4 * 2**20  # bytes of a block of 1 KiB / 4 MiB positions
    assert pool_blocks(4096, BS, small) * small == KV_POOL_BYTES
    assert pool_blocks(4096, BS, large) == min_pool_blocks(4096, BS) == 4096 // BS + 1
    assert pool_blocks(4096, BS, small, kv_pool=64 * 100) == 100
    assert pool_blocks(4096, BS, small, kv_pool=10) == min_pool_blocks(4096, BS)


def test_the_room_is_what_is_free_less_the_reserve_or_what_the_budget_left():
    step = 100 * 2**20
    room, why = pool_room(20 * GIB, None, step, 32768)
    assert room == 20 * GIB - RESERVE_BYTES - step
    assert "20.00 GiB of VRAM free" in why and "32768-token cache" in why and "0.10 GiB for the batched step" in why
    room, why = pool_room(20 * GIB, 3 * GIB, step, 32768)  # --vram-budget leaves less than the card has free
    assert room == 3 * GIB - step and "the VRAM budget leaves 3.00 GiB" in why
    assert pool_room(20 * GIB, 30 * GIB, step, 32768)[0] == 20 * GIB - RESERVE_BYTES - step


def test_the_pool_takes_what_fits_and_none_below_one_context():
    block = BS * 147456  # Qwen3-8B's 144 KiB a position in bf16: 1 GiB is 113 blocks, a 2048 context 33
    want, need = pool_blocks(2048, BS, block), min_pool_blocks(2048, BS)
    assert (want, need) == (113, 33)
    assert pool_plan(2048, BS, block, 0, None) == (want, "")  # host memory: no device limit
    assert pool_plan(2048, BS, block, 0, (want * block, "room")) == (want, "")
    n, line = pool_plan(2048, BS, block, 0, (want * block - 1, "room"))
    assert n == want - 1 and f"holds {n * BS} positions" in line and f"not the {want * BS} wanted" in line
    assert pool_plan(2048, BS, block, 0, (need * block, "room"))[0] == need
    n, line = pool_plan(2048, BS, block, 0, (need * block - 1, "2.00 GiB of VRAM free after ..."))
    assert n == 0
    assert line.startswith("batched decoding is off, one request at a time")
    assert f"needs {need * block / GIB:.2f} GiB (one context of 2048 tokens)" in line
    assert f"but {(need * block - 1) / GIB:.2f} GiB is left for it (2.00 GiB of VRAM free after ...)" in line
    assert "smaller --ctx" in line
    assert pool_plan(2048, BS, block, 0, (-GIB, "room"))[0] == 0  # less than nothing left: no pool, no crash


def test_a_card_the_model_nearly_fills_serves_one_request_at_a_time_until_the_context_shrinks():
    """Qwen3-8B in BF16 (16.4 GB of weights, 40960 positions of 144 KiB) on a 24 GiB card: the
    whole context fits (fit_context: 5.6 GiB), a pool of one more context beside it does not, so
    the engine decodes one request at a time; at --ctx 8192 both fit and it batches."""
    budget, weights, warm = 24 * GIB, int(16.4e9), 600 * 2**20  # warm: buffers the warm-up allocated
    per_token = kv_token_bytes(36, 8, 128, "bf16")
    block, step = int(per_token) * BS, 80 * 2**20
    results = {}
    for asked in (0, 8192):
        n_ctx = fit_context(40960, asked, budget, weights, 36, 8, 128, "bf16")
        free = int(budget - weights - n_ctx * per_token - warm)  # after the runner is built
        results[asked] = n_ctx, pool_plan(n_ctx, BS, block, 0, pool_room(free, None, step, n_ctx))
    (ctx_full, (blocks_full, line)), (ctx_8k, (blocks_8k, line_8k)) = results[0], results[8192]
    assert ctx_full == 40960 and blocks_full == 0 and "one request at a time" in line and f"{ctx_full} tokens" in line
    assert ctx_8k == 8192 and blocks_8k == pool_blocks(8192, BS, block) and line_8k == ""


@pytest.fixture(scope="module")
def ck():
    c = synthetic_checkpoint(SPEC_SHAPE, "Q8_0")
    c.tokenizer = word_tokenizer(SPEC_SHAPE["vocab_size"])
    return c


def _engine(ck, room=None, fail=None, **kw):
    """An engine over a NumPy runner that reports ``room`` for its pool as a device runner would
    (kv_pool_room) and whose init_kv_pool raises ``fail``."""
    runner = numpy_runner(ck, 256)
    if room is not None:
        runner.kv_pool_room = lambda step_rows: room
    if fail is not None:
        def init_kv_pool(n_blocks):
            raise fail
        runner.init_kv_pool = init_kv_pool
    return Engine(ck, runner, "cpu", "CPU (NumPy)", "test", **kw)


def _reply(engine) -> str:
    text, end = engine.submit(GenerationRequest(prompt="w1 w2 w3", sampling=SamplingParams(temperature=0, max_tokens=5))).result()
    assert type(end).__name__ == "DoneEvent", end
    return text


def test_the_engine_batches_with_the_pool_that_fits(ck):
    block = numpy_runner(ck, 256).kv_block_bytes()
    e = _engine(ck, room=(10**6 * block, "room"))
    try:
        assert e.batched and e.load_note == ""
        assert e.scheduler.pages.n_blocks == pool_blocks(256, 16, block)
        _reply(e)
    finally:
        e.close()
    e = _engine(ck, room=(40 * block, "room"), kv_pool=16 * 1000)
    try:
        assert e.batched and e.scheduler.pages.n_blocks == 40 and "not the 16000 wanted" in e.load_note
    finally:
        e.close()


def test_without_room_for_one_context_the_engine_serves_one_request_at_a_time(ck):
    block = numpy_runner(ck, 256).kv_block_bytes()
    e = _engine(ck, room=(5 * block, "0.01 GiB of VRAM free"))
    try:
        assert not e.batched and e.scheduler is None
        assert "one request at a time" in e.load_note and "one context of 256 tokens" in e.load_note
        assert "0.01 GiB of VRAM free" in e.load_note
        solo = _reply(e)
    finally:
        e.close()
    e = _engine(ck, room=(10**6 * block, "room"))
    try:
        assert _reply(e) == solo  # batched or not, the same tokens
    finally:
        e.close()


def test_a_pool_that_runs_out_of_memory_falls_back_to_one_request_at_a_time(ck):
    e = _engine(ck, fail=MemoryError("out of memory allocating the pool"))
    try:
        assert not e.batched and "ran out of memory (MemoryError)" in e.load_note
        _reply(e)
    finally:
        e.close()
    with pytest.raises(ValueError):  # anything else is a bug, not a fallback
        _engine(ck, fail=ValueError("a bug"))


def test_max_batch_1_makes_no_pool(ck):
    def no_room(step_rows):
        raise AssertionError("the pool is not sized at --max-batch 1")

    runner = numpy_runner(ck, 256)
    runner.kv_pool_room = no_room
    e = Engine(ck, runner, "cpu", "CPU (NumPy)", "test", batch=1)
    try:
        assert not e.batched and e.load_note == "" and getattr(runner, "pool", None) is None
        _reply(e)
    finally:
        e.close()


def test_info_counts_the_pool_where_the_engine_batches():
    """`bw24chat info`'s VRAM estimate: the pool of batched decoding is in it unless the engine
    would decode one request at a time (--max-batch 1, a model with recurrent layers, experts
    spilled out of VRAM)."""
    from bw24chat.info import vram_estimate, vram_line

    ck = synthetic_checkpoint("tiny", "Q8_0")
    v = vram_estimate(ck)
    block = BS * v["kv_cache"] // v["context"]
    assert KV_POOL_BYTES - block < v["kv_pool"] <= KV_POOL_BYTES  # 1 GiB in whole blocks
    assert v["total"] == v["weights"] + v["kv_cache"] + v["kv_pool"] + v["workspace"]
    assert "batched decoding's KV pool 1.00" in vram_line(v)
    assert vram_estimate(ck, max_batch=1)["kv_pool"] == 0 and "pool" not in vram_line(vram_estimate(ck, max_batch=1))
    assert vram_estimate(ck, tiers={"fits": True, "all_resident": False})["kv_pool"] == 0
    assert vram_estimate(ck, tiers={"fits": True, "all_resident": True})["kv_pool"] == v["kv_pool"]
    assert vram_estimate(synthetic_checkpoint("tiny-qwen3.5", "Q8_0"))["kv_pool"] == 0
