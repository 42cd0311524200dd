"""The runner interface both backends implement (``NumpyRunner``, ``CudaRunner``).

A runner owns a model's weights and one sequence's KV cache on its backend.  It keeps no
notion of text: ``generate.py`` drives it with token ids.

  ``n_ctx``, ``vocab_size``, ``args`` (the model's ModelArgs)
  ``prefill(ids, start, params=None, seed=0, history=()) -> int | None``
        run ``ids`` at positions start..start+T-1 (any T, chunked inside), then, given
        ``params``, sample the token at position start+T
  ``step(tokens, start, params, seed, history) -> list[int]``
        m rows of one sequence (one pass for m <= MAX_ROWS; more take several passes):
        tokens[i] at position start+i; returns
        the token sampled after each row (the row's own logits, Philox draw keyed by seed and
        position start+i+1, repetition history ``history + tokens[:i+1]``).  Each row's
        numerics equal a one-row step at that position bit for bit (speculative verify relies
        on it).
  ``last_logits() -> np.ndarray``  host copy of the logits of the last prefill (1, V) or step (m, V)
  ``last_hidden() -> (T, D)``  the trunk's last-layer output (before the final norm) of every row
        of the last prefill (T rows) or step (m rows): what an MTP head pairs with the token
        after each row (models/mtp.py; speculative.MTPDrafter)
  ``mtp`` (the model's MTP head or None) and, where it is not None,
  ``mtp_forward(ids, hidden, start, from_trunk) -> (logits (V,), g (D,))``  the head over rows
        pairing ids[i] (token t+1) with hidden[i] (h_t) at positions t = start+i, in the head's
        own KV cache (positions >= start overwritten); the last row's logits and output hidden
        state g (which the next chained row takes with from_trunk=False)
  ``mtp_draft(ids, hidden, start, k, params, seed, history) -> list[int]``  k drafts: mtp_forward
        over the catch-up rows (from_trunk), then k - 1 rows chained on the head's own g (row j
        embeds draft j); draft j is the token at position p = start + len(ids) + 1 + j, drawn as
        ``step`` draws its token there (Philox keyed by seed and p, repetition history
        ``history`` + the drafts before it; params None: greedy).  The CUDA runner keeps the
        chain on the device (graphs) and reads back only the drafts
  ``prefill_logits(ids, start, chunk=None) -> (T, V)``  logits at every position (checks)
  ``rollback(n)``  positions >= n are no longer valid (after a rejected speculative draft)
  ``memory_info() -> dict``

``history`` is always the ids at positions 0..start-1 (the sampler's repetition penalty window),
or only the last sampling.REPEAT_WINDOW_MAX of them: no draw looks further back.

Batched steps (continuous batching: scheduler.py drives them; ``max_batch(runner)`` > 1 says a
runner has them, else the engine serves one sequence at a time through prefill / step):

  ``max_batch``   the most sequences one ``batch_step`` takes
  ``prefill_chunk`` (optional)  the rows of one pass of ``prefill`` (CUDA: what its prefill
        buffers hold); a step with no decode row waiting takes that many prefill rows
        (scheduler.py), as a solo prefill would
  ``block_size``  positions per KV block, a power of two (16 or 64: a block is the unit of the
        paged pool, of prefix sharing and of the attention kernel's key tiles)
  ``kv_block_bytes() -> int``  the bytes of one block over every layer (K and V): the engine
        sizes the pool with it
  ``kv_pool_room(step_rows) -> (int, str)``  (a device runner only) the bytes the pool's blocks
        may take now, before the pool exists, for steps of up to step_rows rows, and where that
        figure comes from, for the user; the engine takes as many blocks as fit (engine.pool_plan)
        and serves one request at a time where not even one context does
  ``init_kv_pool(n_blocks)``  allocate the paged pool: n_blocks blocks, ids 0..n_blocks-1.  The
        pool is separate from the single-sequence cache of prefill / step; which block holds what
        is the engine's bookkeeping (kv_pages.KVPages), never the runner's
  ``batch_step(work: list[SeqWork]) -> list[list[int]]``  one pass over several sequences'
        rows: each SeqWork is T >= 1 rows of one sequence at positions start..start+T-1 whose
        K/V live in the pool blocks of its block table (position p in block table[p //
        block_size], slot p % block_size), writing their K/V there and attending over positions
        0..p through the same table; returns per item the tokens it samples: none without
        params, else the token after its last row, or with ``sample_all`` (a speculative verify:
        the current token and its drafts as decode rows) the token after each row, drawn as
        ``step`` draws it.  ``last_logits()`` then holds the logits of those rows, items in order.

The batch-invariance contract (what ``bw24chat check --batch`` gates): every item's K/V, logits
and token equal bit for bit what the same item computes alone (B = 1), whatever else is in the
step, and:
  * decode rows (``prefill=False``) equal a one-row ``step`` at that position: the products of a
    row are computed with the same reduction tree whatever the number of rows (on CUDA: the
    m-row-invariant matvecs, extended past MAX_ROWS; on NumPy: one-row products), attention
    reads a row's own positions with a split rule that depends only on its length;
  * prefill rows (``prefill=True``) have values independent of how the prompt was cut into
    chunks and of the rows beside them (on NumPy: products over fixed tiles, backends/
    numpy_backend.PREFILL_TILE; on CUDA: the GEMM without split-K, key blocks at absolute
    multiples of the block size).  That is what lets a prompt prefix computed by one sequence
    serve another (prefix sharing) and a prompt be prefilled in budget-sized chunks;
  * sampling keys each draw by (seed, position) (sampling.py), so a row's token does not depend
    on the batch either.
A device implementation takes the tables as int32 arrays (B x max blocks, padded), positions and
lengths as int32, and the sampling parameters as one record per row, so a step of a given batch
size can be one CUDA graph whatever the tables hold.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..api import SamplingParams

MAX_ROWS = 8


@dataclass
class SeqWork:
    """One sequence's rows in a ``batch_step``."""

    ids: np.ndarray  # (T,) token ids at positions start .. start + T - 1
    start: int
    table: np.ndarray  # int32 block ids; covers every position up to start + T - 1
    prefill: bool  # prefill rows (chunk-invariant) or decode rows (each equals a one-row step)
    params: SamplingParams | None = None  # sample the token after the last row (position start + T)
    seed: int = 0
    history: Sequence[int] = field(default=())  # the ids at positions 0 .. start - 1 (or their last REPEAT_WINDOW_MAX)
    sample_all: bool = False  # sample after every row (speculative verify; decode rows)


def max_batch(runner) -> int:
    """The sequences one batched step of ``runner`` takes (1: it has no batched step)."""
    return int(getattr(runner, "max_batch", 1))


def prefill_chunk(runner) -> int:
    """The rows of one prefill pass of ``runner`` (0: it prefills a prompt in one pass)."""
    return int(getattr(runner, "prefill_chunk", 0))
