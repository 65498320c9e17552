"""Pure attack on Chunked / BodyDigests over thousands of steps (origin moves far)."""
import hashlib, random, sys, copy
from ctxrt.request_ledger import Chunked, Shared, BodyDigests, body_digest

seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
rng = random.Random(seed)
ctr = iter(range(10**9))
def d():
    return hashlib.sha256(str(next(ctr)).encode()).digest()

# 1. Chunked.then long runs
checks = 0
digests = [d() for _ in range(2700)]
ch = Chunked.of(digests)
for step in range(5000):
    kind = rng.random()
    head = rng.choice([0, 0, 0, 1, 2, 3])
    drop = min(rng.choice([0, 0, 1, 2, 3, 5, 30, 63]), len(digests))
    cut = rng.choice([0]*20 + [1, 2, 40]) if kind < 0.995 else rng.randint(0, len(digests))
    keep = max(len(digests) - drop - cut, 0)
    grow = rng.choice([1, 2, 3, 0, 10, 100])
    if kind > 0.997:  # jump: budget change (window much larger/smaller)
        grow = rng.randint(0, 3000)
    if len(digests) > 4000:
        drop = min(len(digests), drop + 500); keep = max(len(digests) - drop - cut, 0)
    h = [d() for _ in range(head)]; t = [d() for _ in range(grow)]
    ch = ch.then(Shared(head, drop, keep), h, t)
    maxo = max(globals().get("maxo", 0), ch.origin)
    digests = [*h, *digests[drop:drop + keep], *t]
    if step % 7 == 0 or step > 4900:
        a = Chunked.of(digests)
        assert (ch.chunks, ch.ends, ch.sums) == (a.chunks, a.ends, a.sums), step
        checks += 1
print("chunked ok", checks, "origin", ch.origin, "max", maxo)

# 2. BodyDigests with body-cache-like sharing: turns shared by identity, last turn fresh copy
blk = lambda: {"type": "text", "text": f"b{next(ctr)}"}
memo = BodyDigests()
turns = [{"role": "user" if i % 2 else "assistant", "content": [blk() for _ in range(rng.randint(1, 4))]} for i in range(400)]
bchecks = 0
for step in range(3000):
    r = rng.random()
    # window slides
    turns = turns[rng.choice([0, 0, 1, 2, 3]):]
    if r < 0.3 and turns:  # the last turn grows (a same-role message appended): new dict, shared blocks + new
        last = turns[-1]
        turns[-1] = {"role": last["role"], "content": last["content"] + [blk() for _ in range(rng.randint(1, 3))]}
    elif r < 0.35 and turns:  # the first turn trimmed (merged turn trimmed at front)
        first = turns[0]
        turns[0] = {"role": first["role"], "content": first["content"][rng.randint(1, 3):] or [blk()]}
    elif r < 0.4 and len(turns) > 3:  # an edit in the middle: that turn made again
        at = rng.randrange(len(turns))
        turns[at] = {"role": turns[at]["role"], "content": [blk()]}
    else:
        role = "assistant" if turns and turns[-1]["role"] == "user" else "user"
        turns.append({"role": role, "content": [blk() for _ in range(rng.randint(1, 3))]})
    if r > 0.995:  # a big jump: budget raised -> many older turns
        turns = [{"role": "user", "content": [blk() for _ in range(300)]}] + turns
    if rng.random() < 0.02:  # an all-user merged item with many blocks
        turns.append({"role": "user" if turns[-1]["role"] == "assistant" else "assistant", "content": [blk() for _ in range(rng.randint(50, 400))]})
    body = {"system": "s", "messages": list(turns)}
    body["messages"][-1] = {"role": turns[-1]["role"], "content": list(turns[-1]["content"])}
    body["messages"][-1]["content"][-1] = copy.deepcopy(turns[-1]["content"][-1])
    fresh = body_digest(copy.deepcopy(body))
    got = body_digest(body, memo)
    assert got == fresh, step
    bchecks += 1
    # host edits ITS copy (not the ledger's) -- irrelevant here; but also the ledger body's last item as P14
    if rng.random() < 0.3:
        body["messages"][-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        assert body_digest(body, memo) == body_digest(copy.deepcopy(body)), step
print("bodydigests ok", bchecks)
