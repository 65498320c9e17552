"""Random equal-length edit sequences on long windows through one CompileMemo, strict, against the
reference compile with no memo. Targets _head (the newest-64 look-back) and _copy_run."""
from __future__ import annotations
import random, sys, attrs
from ctxrt.compile.pipeline import CompileMemo
sys.path.insert(0, "tests")
from test_incremental_compile import Pool, KINDS, _build, _reference, _bodies, _injections  # type: ignore

def run(seed: int) -> int:
    rng = random.Random(seed)
    size = rng.choice([70, 130, 200])
    kinds = [rng.choice(KINDS) for _ in range(size)]
    pool = Pool(kinds)
    memo = CompileMemo()
    n = rng.choice([63, 64, 65, 66, 100, 129, 150, size])
    variants = ["canonical"] * 6 + ["marked", "shaped", "summary", "empty", "equal"]
    entries = [pool.entry(k % size, rng.choice(variants)) for k in range(n)]
    injected = {}
    previous = None
    stamp = 0
    compiles = 0
    for _ in range(40):
        # several equal-length changes between compiles
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            if not entries:
                break
            L = len(entries)
            where = rng.choice(["first", "newest", "b64", "b65", "b63", "any", "any"])
            at = {"first": 0, "newest": L - 1, "b64": L - 64, "b65": L - 65, "b63": L - 63}.get(where, rng.randrange(L))
            at = max(0, min(L - 1, at))
            op = rng.choice(["renew", "edit", "variant", "swap", "editremove", "mark"])
            k = int(entries[at].source_ids[0]) - 1
            if op == "renew":
                entries[at] = attrs.evolve(entries[at])
            elif op == "edit":
                entries = pool.edit(k, entries); stamp += 1
            elif op == "variant":
                entries[at] = pool.entry(k, rng.choice(variants))
            elif op == "swap" and L > 1:
                b = rng.randrange(L); entries[at], entries[b] = entries[b], entries[at]
            elif op == "editremove" and L > 2:
                # replace one entry, remove another, append one: count kept equal
                entries[at] = pool.entry(rng.randrange(size), rng.choice(variants))
                del entries[rng.randrange(L)]
                entries.append(pool.entry(rng.randrange(size), rng.choice(variants)))
            elif op == "mark":
                out = [pool.entries.get((int(e.source_ids[0]) - 1, "canonical"), e) if e.cache_marker else e for e in entries]
                c = out[at]
                out[at] = attrs.evolve(c, cache_marker=True) if c.content else c
                entries = out
        if rng.random() < 0.1:
            entries = entries + [pool.entry(rng.randrange(size), "canonical")]
        if rng.random() < 0.05:
            injected = _injections(rng.choice(["none", "system", "around", "depth"]))
        result = _build(entries, pool, memo, injected, strict=True, stamp=stamp if seed % 2 else None)
        expected = _reference(entries, pool, injected, previous)
        assert result.messages == expected.messages, seed
        assert result.provenance.messages == expected.provenance.messages, seed
        assert dict(result.provenance.raw_bodies) == dict(expected.provenance.raw_bodies), seed
        assert _bodies(result) == _bodies(expected), seed
        assert result.stable_prefix_tokens == expected.stable_prefix_tokens, seed
        previous = expected
        compiles += 1
    return compiles

if __name__ == "__main__":
    lo, hi = int(sys.argv[1]), int(sys.argv[2])
    total = 0
    fails = []
    for s in range(lo, hi):
        try:
            total += run(s)
        except Exception as e:  # noqa
            fails.append((s, type(e).__name__, str(e)[:200]))
            print("FAIL", s, type(e).__name__, str(e)[:300], flush=True)
    print("compiles", total, "seeds", hi - lo, "fails", len(fails))
