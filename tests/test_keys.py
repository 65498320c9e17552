"""Key codecs and log heads: order-preserving, round-tripping. Pure: no LMDB, no event loop."""

from hypothesis import given
from hypothesis import strategies as st

from ctxrt.testing import LogHead, keys

u32 = st.integers(0, keys.MAX_U32)
u64 = st.integers(0, keys.MAX_U64)
item_keys = st.tuples(u32, u32, u64, u64)
head_keys = st.tuples(u32, u32, u64)


@given(item_keys, item_keys)
def test_item_keys_sort_as_their_tuples(a, b):
    """K1: item keys compare bytewise exactly as (state, branch, ordinal, seq) tuples compare."""
    assert (keys.item_key(*a) < keys.item_key(*b)) == (a < b)
    assert (keys.item_key(*a) == keys.item_key(*b)) == (a == b)


@given(item_keys)
def test_item_keys_round_trip_and_start_with_their_prefixes(a):
    """K1: an item key decodes to its tuple and starts with its (state, branch, ordinal) prefix."""
    encoded = keys.item_key(*a)
    assert keys.decode_item_key(encoded) == a
    assert encoded.startswith(keys.item_prefix(*a[:3]))
    assert encoded.startswith(keys.state_branch_prefix(*a[:2]))


@given(head_keys, head_keys)
def test_head_keys_sort_as_their_tuples_and_round_trip(a, b):
    """K1: head keys preserve (state, branch, seq) order and decode back."""
    assert (keys.head_key(*a) < keys.head_key(*b)) == (a < b)
    assert keys.decode_head_key(keys.head_key(*a)) == a


@given(u64, u64)
def test_integer_codecs_preserve_order(a, b):
    """K1: big-endian integers sort numerically as bytes."""
    assert (keys.encode_u64(a) < keys.encode_u64(b)) == (a < b)
    assert keys.decode_u64(keys.encode_u64(a)) == a


@st.composite
def heads(draw):
    """A log head with random merged removed intervals over its ordinals."""
    next_ordinal = draw(st.integers(0, 200))
    cuts = sorted(draw(st.sets(st.integers(0, next_ordinal), max_size=10)))
    removed = []
    for start, stop in zip(cuts[::2], cuts[1::2]):
        if start < stop:
            removed.append((start, stop))
    hidden = sum(stop - start for start, stop in removed)
    return LogHead(next_ordinal - hidden, next_ordinal, tuple(removed), draw(u64), draw(u64))


@given(heads())
def test_log_heads_round_trip(head):
    """K1: a log head encodes and decodes to itself, removed intervals included."""
    assert LogHead.decode(head.encode()) == head


@given(heads())
def test_index_and_ordinal_mappings_agree_with_the_visible_list(head):
    """K1: index -> ordinal -> index is the identity over visible items; removed ordinals map to None."""
    visible = [o for o in range(head.next_ordinal) if not any(a <= o < b for a, b in head.removed)]
    assert len(visible) == head.length
    assert [head.index_to_ordinal(i) for i in range(head.length)] == visible
    assert [head.ordinal_to_index(o) for o in visible] == list(range(head.length))
    assert all(head.ordinal_to_index(o) is None for o in range(head.next_ordinal) if o not in visible)
    if head.next_ordinal:
        assert list(head.visible_ordinals(0, head.next_ordinal - 1)) == visible
