"""The paged KV bookkeeping (kv_pages.KVPages) under random operation sequences, checked after
every operation against a plain model of what must hold: every block in exactly one state,
reference counts equal to the tables that hold a block, a shared block's contents equal to what
each holder expects at those positions (the pool's contents are simulated: each computed position
writes its token id into its slot), the longest published prefix reused, least recently released
blocks evicted first, and a reserve refused only when free and cached blocks cannot cover it."""
import numpy as np
import pytest

from bw24chat.kv_pages import KVPages, PoolExhausted, block_hash


class Model:
    """The test's side: the simulated pool contents and the sequences' progress."""

    def __init__(self, pages: KVPages, rng):
        self.p, self.rng = pages, rng
        self.content = np.full((pages.n_blocks, pages.block_size), -1, np.int64)
        self.seqs = {}  # id -> [ids, n_prompt, computed]
        self.next_id = 0
        self.published = {}  # chain key -> block: what the pool should offer (never evicted ones)
        self.release_order = []  # cached blocks, least recently released first

    # -- operations
    def open(self, ids, n_prompt):
        sid = self.next_id
        self.next_id += 1
        bs = self.p.block_size
        shareable = n_prompt - 1
        want, key = 0, b""
        if self.p.share:
            for j in range(shareable // bs):
                key = block_hash(key, ids[j * bs:(j + 1) * bs])
                if key not in self.published:
                    break
                want += bs
        got = self.p.open(sid, ids, shareable)
        assert got == want
        for b in self.p.seqs[sid].blocks:
            if b in self.release_order:
                self.release_order.remove(b)
        self.seqs[sid] = [ids, n_prompt, got]
        return sid

    def advance(self, sid, k):
        ids, n_prompt, done = self.seqs[sid]
        k = min(k, len(ids) - done)
        if k <= 0:
            return
        need = self.p.blocks_for(done + k) - len(self.p.seqs[sid].blocks)
        avail = self.p.n_free + self.p.n_cached
        cached_before = list(self.p.cached)
        ok = self.p.reserve(sid, done + k)
        assert ok == (need <= avail)
        if not ok:
            assert list(self.p.cached) == cached_before
            return False
        evicted = [b for b in cached_before if b not in self.p.cached]
        # eviction takes the least recently released blocks, and only once no free block is left
        assert evicted == self.release_order[:len(evicted)]
        del self.release_order[:len(evicted)]
        self.published = {k_: b for k_, b in self.published.items() if b not in evicted}
        t = self.p.table(sid)
        bs = self.p.block_size
        for pos in range(done, done + k):  # the runner writing K/V
            self.content[t[pos // bs], pos % bs] = ids[pos]
        self.seqs[sid][2] = done + k
        final = min(done + k, n_prompt)
        self.p.publish(sid, ids, final)
        key = b""
        for j in range(final // bs if self.p.share else 0):
            key = block_hash(key, ids[j * bs:(j + 1) * bs])
            self.published.setdefault(key, int(t[j]))
        return True

    def close(self, sid):
        t = list(self.p.table(sid))
        del self.seqs[sid]
        self.p.close(sid)
        for b in reversed(t):
            if self.p.ref[b] == 0 and b in self.p.key_of:
                self.release_order.append(b)

    # -- what must hold
    def check(self):
        p = self.p
        tables = {sid: list(p.table(sid)) for sid in self.seqs}
        count = np.zeros(p.n_blocks, np.int64)
        for t in tables.values():
            assert len(set(t)) == len(t)
            for b in t:
                count[b] += 1
        assert np.array_equal(count, p.ref)
        used = {b for b in range(p.n_blocks) if p.ref[b] > 0}
        free, cached = set(p.free), set(p.cached)
        assert len(p.free) == len(free)
        assert not (used & free) and not (used & cached) and not (free & cached)
        assert used | free | cached == set(range(p.n_blocks))
        assert p.n_used + p.n_free + p.n_cached == p.n_blocks
        assert {b: k for k, b in p.by_key.items()} == p.key_of
        assert not (set(p.key_of) & free) and cached <= set(p.key_of)
        assert list(p.cached) == self.release_order
        assert {k: b for k, b in self.published.items()} == p.by_key
        bs = p.block_size
        for sid, (ids, n_prompt, done) in self.seqs.items():
            t = tables[sid]
            assert len(t) >= p.blocks_for(done)
            for pos in range(done):
                assert self.content[t[pos // bs], pos % bs] == ids[pos], (sid, pos)


def _random_ids(rng, prefixes, vocab=50):
    """A prompt that often starts with one of a few shared prefixes, plus a continuation."""
    head = list(prefixes[rng.integers(len(prefixes))]) if rng.random() < 0.7 else []
    n_prompt = len(head) + int(rng.integers(1, 40))
    ids = head + [int(t) for t in rng.integers(0, vocab, n_prompt - len(head) + int(rng.integers(0, 30)))]
    return ids, n_prompt


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("share", [True, False])
def test_random_operations_keep_the_invariants(seed, share):
    rng = np.random.default_rng(seed)
    bs = [1, 2, 4, 16][seed % 4]
    n_blocks = int(rng.integers(2, 40)) * (16 // bs)
    pages = KVPages(n_blocks, bs, share_prefixes=share)
    m = Model(pages, rng)
    prefixes = [[int(t) for t in rng.integers(0, 50, int(rng.integers(bs, 5 * bs)))] for _ in range(3)]
    capacity = n_blocks * bs
    hits_before = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.25 or not m.seqs:
            ids, n_prompt = _random_ids(rng, prefixes)
            ids = ids[:capacity]  # a sequence never outgrows the pool (the engine sizes it so)
            n_prompt = min(n_prompt, len(ids))
            m.open(ids, n_prompt)
        elif op < 0.85:
            sid = list(m.seqs)[rng.integers(len(m.seqs))]
            if m.advance(sid, int(rng.integers(1, 3 * bs + 2))) is False:
                # preemption: drop a sequence (possibly this one) and recompute it later
                victim = list(m.seqs)[rng.integers(len(m.seqs))]
                ids, n_prompt, _ = m.seqs[victim]
                m.close(victim)
                m.open(ids, n_prompt)
        else:
            m.close(list(m.seqs)[rng.integers(len(m.seqs))])
        m.check()
        hits_before = pages.hit_tokens
    for sid in list(m.seqs):
        m.close(sid)
    m.check()
    assert pages.n_used == 0
    if not share:
        assert pages.hit_tokens == 0 and pages.n_cached == 0
    else:
        assert hits_before > 0  # the shared prefixes were reused


def test_full_pool_is_refused_not_corrupted():
    p = KVPages(4, 4)
    p.open("a", list(range(16)), 0)
    assert p.reserve("a", 16)
    p.open("b", list(range(8)), 0)
    assert not p.reserve("b", 1)  # nothing free, nothing cached
    assert len(p.table("b")) == 0
    p.publish("a", list(range(16)), 16)
    p.close("a")  # four cached blocks, tail first
    assert p.reserve("b", 5)  # evicts the two least recently released: a's tail
    assert sorted(p.table("b")) == sorted([3, 2]) and p.evictions == 2
    assert p.open("c", list(range(16)), 15) == 8  # a's first two blocks are still there
    with pytest.raises(PoolExhausted):
        p.reserve("c", 17)


def test_prefix_hits_stop_at_the_first_difference_and_at_shareable():
    p = KVPages(16, 4)
    ids = list(range(20))
    p.open("a", ids, 20)
    p.reserve("a", 20)
    p.publish("a", ids, 20)
    assert p.open("b", ids, 19) == 16  # the last position is always recomputed by the caller's choice
    assert p.open("c", ids[:9] + [99] + ids[10:], 19) == 8  # block 2 differs
    assert p.open("d", [7] + ids[1:], 19) == 0
    assert p.table("b").tolist() == p.table("a").tolist()[:4]
    assert p.ref[p.table("a")[0]] == 3
    p.publish("a", ids, 20)  # publishing twice changes nothing
    assert len(p.by_key) == 5


def test_block_size_must_be_a_power_of_two():
    with pytest.raises(ValueError):
        KVPages(8, 12)
