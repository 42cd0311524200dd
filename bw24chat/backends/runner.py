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

``history`` is always the ids at positions 0..start-1 (the sampler's repetition penalty window).
"""
from __future__ import annotations

MAX_ROWS = 8
