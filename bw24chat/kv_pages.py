"""The paged KV cache's bookkeeping: which pool block holds which positions of which sequence.

The pool (the runner's, ``init_kv_pool``) is ``n_blocks`` blocks of ``block_size`` positions.  A
sequence's block table lists its blocks in position order: position p lives in block
``table[p // block_size]``, slot ``p % block_size``.  This module never touches K/V values; the
runner reads and writes them through the tables (backends/runner.py: batch_step).

Prefix sharing (vLLM's automatic prefix caching, Kwon et al. 2023, "Efficient Memory Management
for Large Language Model Serving with PagedAttention", §4.4): a full block whose K/V are final is
published under the hash of its tokens chained to its prefix's hash, so a block stands for the
whole prefix up to its end.  A new sequence whose prompt starts with published blocks takes them
(a reference each) instead of computing them again: system prompts, the earlier turns of a chat,
the n choices of one request.  Only full blocks are shared and a shared block is never written
again, so no copy-on-write is needed.  The caller publishes only blocks computed by prefill rows
(their values do not depend on how they were computed: backends/runner.py), which keeps every
sequence's output the same with sharing on or off.

A block is in exactly one state: referenced (by one or more tables), cached (published,
unreferenced: kept for later hits, evicted least recently released first when blocks run
short; a sequence's tail blocks are released first, so they go first), or free.  When even
eviction cannot supply a block, ``reserve`` says so and changes nothing: the scheduler then
preempts a sequence (``close`` it, recompute it later), never crashes.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Hashable, Sequence

import numpy as np


KV_POOL_BYTES = 1 << 30  # the pool's default size, where memory allows it (at least one full context)


def min_pool_blocks(n_ctx: int, block_size: int) -> int:
    """The fewest blocks a pool may have: the oldest sequence can always reach the context's end
    (one full context) while another holds a block."""
    return -(-n_ctx // block_size) + 1


def pool_blocks(n_ctx: int, block_size: int, block_bytes: int, kv_pool: int = 0) -> int:
    """The blocks an engine wants in its pool: ``kv_pool`` positions (--kv-pool), or 0: KV_POOL_BYTES
    of K/V; at least min_pool_blocks."""
    tokens = kv_pool or KV_POOL_BYTES // block_bytes * block_size
    return max(-(-tokens // block_size), min_pool_blocks(n_ctx, block_size))


def block_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The key of a full block: BLAKE2b over the parent block's key and this block's token ids
    (int64 little-endian), so equal keys mean equal prefixes (a 128-bit collision aside)."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(np.asarray(tokens, "<i8").tobytes())
    return h.digest()


@dataclass
class _Seq:
    blocks: list[int] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)  # chain keys of its first full blocks (computed so far)


class PoolExhausted(RuntimeError):
    """A sequence needs more blocks than the whole pool has (the scheduler refuses it up front)."""


class KVPages:
    def __init__(self, n_blocks: int, block_size: int, share_prefixes: bool = True):
        if block_size < 1 or block_size & (block_size - 1):
            raise ValueError(f"block_size {block_size}: a power of two")
        self.n_blocks, self.block_size, self.share = n_blocks, block_size, share_prefixes
        self.ref = np.zeros(n_blocks, np.int32)
        self.key_of: dict[int, bytes] = {}  # published block -> key
        self.by_key: dict[bytes, int] = {}
        self.free: list[int] = list(range(n_blocks - 1, -1, -1))  # popped from the end: block 0 first
        self.cached: OrderedDict[int, None] = OrderedDict()  # published, unreferenced; first = evicted first
        self.seqs: dict[Hashable, _Seq] = {}
        self.hit_tokens = 0  # positions taken from the cache
        self.query_tokens = 0  # positions looked up
        self.evictions = 0

    # ------------------------------------------------------------------ sequences
    def blocks_for(self, n_positions: int) -> int:
        return -(-n_positions // self.block_size)

    def open(self, seq_id: Hashable, ids: Sequence[int], shareable: int) -> int:
        """Start ``seq_id``'s table with the published blocks that hold ids[:shareable] (whole
        blocks only); returns the positions taken from the cache (a multiple of block_size)."""
        if seq_id in self.seqs:
            raise ValueError(f"sequence {seq_id!r} is already open")
        s = self.seqs[seq_id] = _Seq()
        if not self.share:
            return 0
        n_full = min(shareable, len(ids)) // self.block_size
        self.query_tokens += n_full * self.block_size
        for j in range(n_full):
            key = self._key(s, ids, j)
            b = self.by_key.get(key)
            if b is None:
                break
            self._take(b)
            s.blocks.append(b)
        self.hit_tokens += len(s.blocks) * self.block_size
        return len(s.blocks) * self.block_size

    def reserve(self, seq_id: Hashable, n_positions: int) -> bool:
        """Grow ``seq_id``'s table to cover positions 0..n_positions-1, taking free blocks, then
        evicting cached ones; False, changing nothing, if the pool cannot supply them now."""
        s = self.seqs[seq_id]
        need = self.blocks_for(n_positions) - len(s.blocks)
        if need <= 0:
            return True
        if need > len(self.free) + len(self.cached):
            if self.blocks_for(n_positions) > self.n_blocks:
                raise PoolExhausted(f"{n_positions} positions need {self.blocks_for(n_positions)} blocks; the pool has {self.n_blocks}")
            return False
        for _ in range(need):
            if self.free:
                b = self.free.pop()
            else:
                b, _ = self.cached.popitem(last=False)
                del self.by_key[self.key_of.pop(b)]
                self.evictions += 1
            self.ref[b] = 1
            s.blocks.append(b)
        return True

    def publish(self, seq_id: Hashable, ids: Sequence[int], n_final: int) -> None:
        """Positions 0..n_final-1 of ``seq_id`` hold ids[:n_final] and their K/V are final
        prefill values: publish the table's full blocks among them for other sequences."""
        if not self.share:
            return
        s = self.seqs[seq_id]
        for j in range(min(n_final // self.block_size, len(s.blocks))):
            b = s.blocks[j]
            if b in self.key_of:
                continue
            key = self._key(s, ids, j)
            if key not in self.by_key:  # else an equal block is published already: this one stays private
                self.by_key[key] = b
                self.key_of[b] = key

    def close(self, seq_id: Hashable) -> None:
        """Release ``seq_id``'s blocks (tail first, so its tail is evicted before its prefix)."""
        s = self.seqs.pop(seq_id)
        for b in reversed(s.blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if b in self.key_of:
                    self.cached[b] = None
                else:
                    self.free.append(b)

    def table(self, seq_id: Hashable) -> np.ndarray:
        return np.asarray(self.seqs[seq_id].blocks, np.int32)

    def first_miss(self, ids: Sequence[int], shareable: int) -> tuple[int, bytes] | None:
        """(index, key) of the first full block of ids[:shareable] that is not published, or None
        (all are, or sharing is off)."""
        if not self.share:
            return None
        s = _Seq()
        for j in range(min(shareable, len(ids)) // self.block_size):
            key = self._key(s, ids, j)
            if key not in self.by_key:
                return j, key
        return None

    def key_at(self, seq_id: Hashable, ids: Sequence[int], j: int) -> bytes:
        """The chain key of block j of open sequence ``seq_id`` (ids: its ids, covering the block)."""
        return self._key(self.seqs[seq_id], ids, j)

    # ------------------------------------------------------------------ figures
    @property
    def n_free(self) -> int:
        return len(self.free)

    @property
    def n_cached(self) -> int:
        return len(self.cached)

    @property
    def n_used(self) -> int:
        return self.n_blocks - len(self.free) - len(self.cached)

    def available(self) -> int:
        """Blocks a reserve could take now (free or evictable)."""
        return len(self.free) + len(self.cached)

    # ------------------------------------------------------------------ internals
    def _key(self, s: _Seq, ids: Sequence[int], j: int) -> bytes:
        bs = self.block_size
        while len(s.keys) <= j:
            i = len(s.keys)
            s.keys.append(block_hash(s.keys[-1] if s.keys else b"", ids[i * bs:(i + 1) * bs]))
        return s.keys[j]

    def _take(self, b: int) -> None:
        if self.ref[b] == 0:
            del self.cached[b]
        self.ref[b] += 1
