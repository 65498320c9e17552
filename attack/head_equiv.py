"""_head(new, old) == run_length(new, 0, old, 0) for lists of one length whose first items go on
(the same object or an equal one), over random lists of shared, equal-but-distinct and different
items, lengths around the 64-entry look-back."""
import random, sys
from ctxrt.compile.pipeline import _head, _NEWEST
from ctxrt.forms.body_runs import run_length

class Item:
    __slots__ = ("v",)
    def __init__(self, v): self.v = v
    def __eq__(self, other): return isinstance(other, Item) and self.v == other.v
    __hash__ = None

rng = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
checked = 0
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 200000):
    n = rng.choice([1, 2, 3, _NEWEST - 1, _NEWEST, _NEWEST + 1, _NEWEST + 2, 2 * _NEWEST, rng.randint(1, 300)])
    old = [Item(k) for k in range(n)]
    new = list(old)
    for _ in range(rng.choice([0, 1, 1, 2, 3, 8])):
        at = rng.choice([0, n - 1, n - _NEWEST, n - _NEWEST - 1, n - _NEWEST + 1, rng.randrange(n)])
        if not 0 <= at < n:
            continue
        new[at] = Item(new[at].v if rng.random() < 0.4 else -1 - at)  # equal anew, or changed
    if not (new[0] is old[0] or new[0] == old[0]):
        continue
    assert _head(new, old) == run_length(new, 0, old, 0), (n, [(k, new[k] is old[k], new[k] == old[k]) for k in range(n) if new[k] is not old[k]])
    checked += 1
print("checked", checked)
