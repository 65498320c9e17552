"""The block codecs: ingress validation (ctxrt.content.validation), the storage form and the private converter
(ctxrt.content.codec), blobs (ctxrt.content.blobs), the API form of blocks (ctxrt.forms.wire)."""

from __future__ import annotations

import base64
import hashlib
import json

import attrs
import cattrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxrt import Block, Document, Image, Message, RedactedThinking, Text, Thinking, ToolResult, ToolUse, content_for_reader
from ctxrt.content import codec, validation
from ctxrt.testing import extract_blobs, resolve_blobs
from ctxrt.content.codec import from_jsonable, message_from_json, message_to_json, to_jsonable
from ctxrt.errors import MalformedContentError, StoreCorruptError, StoreFormatError
from ctxrt.content.validation import (
    blocks_from_content,
    find_audience,
    validate_metadata,
    validate_participant,
    validate_timestamp_ms,
)
from ctxrt.forms.wire import block_to_api, blocks_from_api

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake image bytes").decode()
PDF = base64.b64encode(b"%PDF-1.4 fake").decode()


def refused(content: object) -> MalformedContentError:
    with pytest.raises(MalformedContentError) as info:
        blocks_from_content(content)  # type: ignore[arg-type]
    return info.value


# --------------------------------------------------------------------------------------------
# Ingress
# --------------------------------------------------------------------------------------------


def test_plain_string_is_one_text_block():
    """API Content: a plain str is one text block."""
    assert blocks_from_content("hello") == (Text("hello"),)


def test_every_api_block_form_is_structured():
    """API Content: dicts in Anthropic Messages API form become the matching block classes."""
    blocks = blocks_from_content(
        [
            {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}},
            {"type": "thinking", "thinking": "hmm", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}, "title": "T"},
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain"}},
            {"type": "tool_use", "id": "t1", "name": "search", "input": {"q": "x"}},
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "r"}], "is_error": True},
        ]
    )
    assert blocks == (
        Text("hi", cache_control={"type": "ephemeral"}),
        Thinking("hmm", "sig"),
        RedactedThinking("opaque"),
        Image({"type": "base64", "media_type": "image/png", "data": PNG}),
        Image({"type": "url", "url": "https://example.com/a.png"}),
        Document({"type": "base64", "media_type": "application/pdf", "data": PDF}, title="T"),
        Document({"type": "text", "media_type": "text/plain", "data": "plain"}),
        ToolUse("t1", "search", {"q": "x"}),
        ToolResult("t1", (Text("r"),), is_error=True),
    )


def test_attrs_blocks_and_dicts_mix_and_normalise_to_json_native_values():
    """M6: attrs blocks are validated like dicts; tuples in a tool input become lists (the stored form)."""
    blocks = blocks_from_content([Text("a"), {"type": "tool_use", "id": "t", "name": "n", "input": {"xs": (1, 2)}}])
    assert blocks == (Text("a"), ToolUse("t", "n", {"xs": [1, 2]}))


def test_null_optional_fields_from_sdk_dumps_are_taken_as_absent():
    """M6: a None value (as the SDK's model_dump writes absent optionals) is not an unknown field."""
    assert blocks_from_content([{"type": "text", "text": "x", "citations": None}]) == (Text("x"),)


@pytest.mark.parametrize(
    ("content", "path"),
    [
        ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}, {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": PNG}}], "content[2].source.media_type"),
        ([{"type": "hologram", "data": "x"}], "content[0].type"),
        ([{"text": "no type"}], "content[0].type"),
        ([{"type": "text", "text": 5}], "content[0].text"),
        ([{"type": "text"}], "content[0].text"),
        ([{"type": "tool_result", "content": "r"}], "content[0].tool_use_id"),
        ([{"type": "tool_result", "tool_use_id": 7, "content": "r"}], "content[0].tool_use_id"),
        ([{"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}], "content[0].is_error"),
        ([{"type": "tool_result", "tool_use_id": "t", "content": 3}], "content[0].content"),
        ([{"type": "tool_use", "id": "t", "name": "n", "input": [1]}], "content[0].input"),
        ([{"type": "tool_use", "id": "", "name": "n", "input": {}}], "content[0].id"),
        ([{"type": "tool_use", "id": "t", "name": "n", "input": {"s": {1, 2}}}], "content[0].input.s"),
        ([{"type": "tool_use", "id": "t", "name": "n", "input": {"f": float("nan")}}], "content[0].input.f"),
        ([{"type": "tool_use", "id": "t", "name": "n", "input": {"a b": ["\ud800"]}}], 'content[0].input["a b"][0]'),
        ([{"type": "text", "text": "ok \udfff"}], "content[0].text"),
        ([{"type": "text", "text": "x", "raw": {"k": object()}}], "content[0].raw.k"),
        ([{"type": "text", "text": "x", "citations": []}], "content[0].citations"),
        ([{"type": "tool_use", "id": "t", "name": "n", "input": {}, "cache_control": {"type": "ephemeral"}}], "content[0].cache_control"),
        ([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "not base64!"}}], "content[0].source.data"),
        ([{"type": "image", "source": {"type": "file", "file_id": "f"}}], "content[0].source.type"),
        ([{"type": "image", "source": "https://x"}], "content[0].source"),
        ([{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "tool_use", "id": "u", "name": "n", "input": {}}]}], "content[0].content[0].type"),
        ([42], "content[0]"),
        ([], "content"),
        ("", "content"),
        ({"type": "text", "text": "a dict, not a list"}, "content"),
    ],
)
def test_malformed_content_is_refused_naming_the_exact_place(content, path):
    """M6: malformed content raises MalformedContentError whose path names the place."""
    assert refused(content).path == path


def test_refusal_message_says_what_and_where():
    """M6: the error text carries the path and the reason."""
    error = refused([{"type": "hologram"}])
    assert str(error).startswith("content[0].type: unknown block type 'hologram'")


def test_custom_path_prefix_is_used():
    """M6: callers name the place of content they validate (an edit, an injection)."""
    with pytest.raises(MalformedContentError) as info:
        blocks_from_content([{"type": "text"}], path="injections[3].content")
    assert info.value.path == "injections[3].content[0].text"


def test_deeply_nested_input_is_refused_not_crashing():
    """M6: JSON nested past MAX_JSON_DEPTH is refused with a path rather than a RecursionError."""
    deep: object = 1
    for _ in range(validation.MAX_JSON_DEPTH + 5):
        deep = [deep]
    error = refused([{"type": "tool_use", "id": "t", "name": "n", "input": {"d": deep}}])
    assert error.path.startswith("content[0].input.d[0]")


def test_non_canonical_base64_is_stored_canonically():
    """M4: media is kept in the spelling its bytes re-encode to, so a write reads back equal."""
    raw = b"ab"
    sloppy = "YWI"  # unpadded, refused by strict mode
    with pytest.raises(MalformedContentError):
        blocks_from_content([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": sloppy}}])
    canonical = base64.b64encode(raw).decode()
    (block,) = blocks_from_content([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": canonical}}])
    assert block.source["data"] == canonical


# --------------------------------------------------------------------------------------------
# Audience rules at ingress (B1, B2)
# --------------------------------------------------------------------------------------------


def test_audience_is_accepted_on_top_level_text_and_thinking():
    """B1: top-level text and thinking blocks may carry an audience; a list becomes a tuple."""
    blocks = blocks_from_content(
        [{"type": "text", "text": "a", "audience": ["bob"]}, {"type": "thinking", "thinking": "t", "audience": ("bob", "eve")}]
    )
    assert blocks == (Text("a", audience=("bob",)), Thinking("t", audience=("bob", "eve")))


@pytest.mark.parametrize(
    "block",
    [
        {"type": "tool_use", "id": "t", "name": "n", "input": {}, "audience": ["bob"]},
        {"type": "tool_result", "tool_use_id": "t", "content": "r", "audience": ["bob"]},
        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}, "audience": ["bob"]},
        {"type": "document", "source": {"type": "url", "url": "https://x/y.pdf"}, "audience": ["bob"]},
        {"type": "redacted_thinking", "data": "d", "audience": ["bob"]},
    ],
)
def test_audience_is_refused_on_blocks_other_than_text_and_thinking(block):
    """B1: an audience on a tool call, tool result, media or redacted thinking is refused, naming the block."""
    error = refused([{"type": "text", "text": "x"}, block])
    assert error.path == "content[1].audience"
    assert block["type"] in error.reason


@pytest.mark.parametrize(
    "nested",
    [{"type": "text", "text": "r", "audience": ["bob"]}, Text("r", audience=("bob",))],
)
def test_audience_is_refused_on_a_block_nested_in_a_tool_result(nested):
    """B1: a block nested in a tool_result may not carry an audience, dict or attrs alike."""
    error = refused([ToolResult("t", (Text("ok"), nested))])
    assert error.path == "content[0].content[1].audience"
    assert "nested in a tool_result" in error.reason


@pytest.mark.parametrize(
    ("audience", "path"),
    [
        ("bob", "content[0].audience"),
        ([], "content[0].audience"),
        ([""], "content[0].audience[0]"),
        (["bob", 3], "content[0].audience[1]"),
        (["\ud800"], "content[0].audience[0]"),
        ({"bob": 1}, "content[0].audience"),
    ],
)
def test_audience_that_is_not_a_non_empty_list_of_names_is_refused(audience, path):
    """B1: an audience must be a non-empty list of non-empty strings."""
    assert refused([{"type": "text", "text": "x", "audience": audience}]).path == path


def test_attrs_text_with_empty_reader_name_is_refused():
    """B1: attrs blocks obey the same audience rules as dicts."""
    assert refused([Text("x", audience=("",))]).path == "content[0].audience[0]"


def test_audience_key_inside_tool_data_is_plain_data():
    """B2: a key named audience in a tool input or in JSON text a tool result carries is stored as written."""
    blocks = blocks_from_content(
        [
            {"type": "tool_use", "id": "t", "name": "n", "input": {"audience": ["bob"]}},
            {"type": "tool_result", "tool_use_id": "t", "content": json.dumps({"audience": "eve"})},
        ]
    )
    assert blocks[0].input == {"audience": ["bob"]}
    assert json.loads(blocks[1].content) == {"audience": "eve"}


def test_find_audience_names_the_first_block_top_level_or_nested():
    """B3/B4: find_audience gives the path of the first block with an audience, wherever it sits."""
    assert find_audience([Text("a"), Text("b", audience=("x",))], path="c") == "c[1]"
    nested = [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "r", "audience": ["x"]}]}]
    assert find_audience(nested, path="injections[0].content") == "injections[0].content[0].content[0]"
    assert find_audience([Text("a"), ToolResult("t", "r")], path="c") is None
    assert find_audience("plain", path="c") is None


# --------------------------------------------------------------------------------------------
# Participant, metadata, timestamps
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("participant", ["", None, 3, "\ud800"])
def test_participant_must_be_a_non_empty_string(participant):
    """M6: a participant that is not a non-empty (UTF-8) string is refused."""
    with pytest.raises(MalformedContentError) as info:
        validate_participant(participant)
    assert info.value.path == "participant"


def test_valid_participant_is_returned():
    """M1: a participant name passes through unchanged."""
    assert validate_participant("Alice") == "Alice"


@pytest.mark.parametrize(
    ("metadata", "path"),
    [
        ([1], "metadata"),
        ({1: "x"}, "metadata[1]"),
        ({"k": object()}, "metadata.k"),
        ({"k": {"deep": float("inf")}}, "metadata.k.deep"),
    ],
)
def test_metadata_that_is_not_json_is_refused(metadata, path):
    """M6: metadata must be a JSON object with string keys."""
    with pytest.raises(MalformedContentError) as info:
        validate_metadata(metadata)
    assert info.value.path == path


def test_metadata_is_copied_into_json_native_form():
    """M1: metadata comes back as plain JSON data (tuples become lists); None stays None."""
    assert validate_metadata({"tags": ("a", "b"), "n": 1}) == {"tags": ["a", "b"], "n": 1}
    assert validate_metadata(None) is None


@pytest.mark.parametrize("value", [True, 1.5, "1", -1, 2**53 + 1, None])
def test_timestamp_must_be_integer_epoch_ms_in_range(value):
    """M1: timestamp_ms is a validated integer epoch millisecond (bool, float, negative, > 2**53 refused)."""
    with pytest.raises(MalformedContentError):
        validate_timestamp_ms(value)


def test_timestamp_in_range_is_accepted():
    """M1: 0 and 2**53 bound the accepted range."""
    assert validate_timestamp_ms(0) == 0
    assert validate_timestamp_ms(2**53) == 2**53


# --------------------------------------------------------------------------------------------
# Storage form
# --------------------------------------------------------------------------------------------


def test_storage_form_is_compact_and_omits_defaults():
    """M1: the stored JSON uses API field names and leaves out None and default fields."""
    data = message_to_json("Alice", (Text("hi"), ToolResult("t", "r")), None, 0, ())
    assert data == b'{"participant":"Alice","content":[{"type":"text","text":"hi"},{"type":"tool_result","tool_use_id":"t","content":"r"}]}'


def test_stored_message_decodes_from_memoryview_with_id_from_sequence():
    """M1: a stored message decodes from an LMDB buffer; its id is its sequence in decimal text."""
    data = message_to_json("Bob", (Text("x", audience=("bob",)),), {"k": [1]}, 1700000000000, ("3",))
    message = message_from_json(memoryview(data), sequence=42, store="test")
    assert message == Message("42", 42, "Bob", (Text("x", audience=("bob",)),), {"k": [1]}, 1700000000000, ("3",))


@pytest.mark.parametrize("stored", ['"bob"', "[1, 2]", "{}", "[]"])
def test_stored_audience_that_is_not_names_decodes_and_names_no_one(stored):
    """A2: a stored audience that is not a list of strings is read without raising and hides the block from everyone."""
    data = ('{"participant":"a","content":[{"type":"text","text":"secret","audience":%s},{"type":"text","text":"open"}]}' % stored).encode()
    message = message_from_json(data, sequence=1, store="test")
    assert message.content[0].audience is not None
    assert content_for_reader(message.content, "bob") == (Text("open"),)


@pytest.mark.parametrize("data", [
    b'{"content":[]}', b'{"participant":"a","content":[{"type":"video"}]}',
    b'{"participant":"a","content":[{"type":"text","text":5}]}', b'{"participant":null,"content":[]}',
    b'{"participant":"a","content":[{"type":"image","source":null}]}',
    b'{"participant":"a","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":[]}]}]}',
    b'{"participant":"a","content":[],"metadata":[1]}',
])
def test_a_stored_message_in_a_form_this_version_does_not_read_raises_store_format_error(data):
    """K5: JSON this version can't read (a newer version's form) raises StoreFormatError, never a stray KeyError."""
    with pytest.raises(StoreFormatError):
        message_from_json(data, sequence=9, store="the store")


@pytest.mark.parametrize("data", [b"not json", b"\xff\xfe", b'{"participant": "user", "content": [{"type": "te',
                                  b'{"participant":"a","content":[]}XYZ', b"[" * 100_000])
def test_a_stored_message_that_is_not_json_raises_store_corrupt_error_naming_the_store(data):
    """K7 (from a host-style attack): bytes that aren't JSON at all are damage (sealed into a record,
    e.g. by a format move), not a newer form: StoreCorruptError naming the store and the message."""
    with pytest.raises(StoreCorruptError, match=r"^store file /x/data.mdb is damaged: stored message 9 doesn't decode"):
        message_from_json(data, sequence=9, store="/x/data.mdb")


# --------------------------------------------------------------------------------------------
# Hypothesis strategies
# --------------------------------------------------------------------------------------------

texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
names = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8)
audiences = st.none() | st.lists(names, min_size=1, max_size=3).map(tuple)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=8,
)
json_objects = st.dictionaries(texts, json_values, max_size=4)
raws = st.none() | json_objects
base64_data = st.binary(min_size=1, max_size=24).map(lambda b: base64.b64encode(b).decode())


def image_blocks(with_raw: bool = True) -> st.SearchStrategy[Block]:
    sources = st.builds(
        lambda mt, data: {"type": "base64", "media_type": mt, "data": data},
        st.sampled_from(sorted(validation.IMAGE_MEDIA_TYPES)),
        base64_data,
    ) | st.builds(lambda u: {"type": "url", "url": "https://example.com/" + u}, st.text("abc", max_size=5))
    return st.builds(Image, sources, raw=raws if with_raw else st.none())


def document_blocks(with_raw: bool = True) -> st.SearchStrategy[Block]:
    sources = st.builds(lambda data: {"type": "base64", "media_type": "application/pdf", "data": data}, base64_data) | st.builds(
        lambda t: {"type": "text", "media_type": "text/plain", "data": t}, texts
    )
    return st.builds(Document, sources, title=st.none() | texts, raw=raws if with_raw else st.none())


def block_strategy(*, with_audience: bool, with_raw: bool) -> st.SearchStrategy[Block]:
    raw = raws if with_raw else st.none()
    audience = audiences if with_audience else st.none()
    cache_control = st.none() | st.just({"type": "ephemeral"})
    nested_text = st.builds(Text, texts, cache_control=cache_control, raw=raw)
    nested = st.one_of(nested_text, image_blocks(with_raw), document_blocks(with_raw))
    ids = st.text("abcdefgh0123456789_-", min_size=1, max_size=10)
    return st.one_of(
        st.builds(Text, texts, audience=audience, cache_control=cache_control, raw=raw),
        st.builds(Thinking, texts, st.none() | texts, audience=audience, raw=raw),
        st.builds(RedactedThinking, texts, raw=raw),
        image_blocks(with_raw),
        document_blocks(with_raw),
        st.builds(ToolUse, ids, names, json_objects, raw=raw),
        st.builds(
            ToolResult,
            ids,
            texts | st.lists(nested, max_size=3).map(tuple),
            is_error=st.booleans(),
            raw=raw,
        ),
    )


# A message's calls have ids of their own (ingress refuses a repeated one).
stored_blocks = st.lists(block_strategy(with_audience=True, with_raw=True), min_size=1, max_size=5,
                         unique_by=lambda b: b.id if isinstance(b, ToolUse) else object()).map(tuple)


@settings(max_examples=300, deadline=None)
@given(
    participant=names,
    content=stored_blocks,
    metadata=st.none() | json_objects,
    timestamp_ms=st.integers(0, 2**53),
    caused_by=st.lists(st.integers(0, 10**9).map(str), max_size=3).map(tuple),
    sequence=st.integers(1, 2**40),
)
def test_storage_form_round_trips_any_valid_message(participant, content, metadata, timestamp_ms, caused_by, sequence):
    """M1: a message written in storage form decodes equal to what was written (audiences, tool cycles, nested results, unicode)."""
    data = message_to_json(participant, content, metadata, timestamp_ms, caused_by)
    decoded = message_from_json(data, sequence=sequence, store="test")
    assert decoded == Message(str(sequence), sequence, participant, content, metadata, timestamp_ms, caused_by)


@settings(max_examples=300, deadline=None)
@given(
    participant=names,
    content=stored_blocks | st.lists(st.builds(Text, st.text()), min_size=1, max_size=3).map(tuple),
    metadata=st.none() | json_objects,
    timestamp_ms=st.integers(0, 2**53),
    caused_by=st.lists(st.integers(0, 10**9).map(str), max_size=3).map(tuple),
)
def test_storage_form_is_the_compact_json_of_the_whole_message(participant, content, metadata, timestamp_ms, caused_by):
    """The storage form, written piece by piece, is byte for byte the compact JSON (ensure_ascii off)
    of the message as one object: what every store written before holds."""
    whole: dict[str, object] = {"participant": participant, "content": [to_jsonable(b) for b in content]}
    if metadata is not None:
        whole["metadata"] = metadata
    if timestamp_ms:
        whole["timestamp_ms"] = timestamp_ms
    if caused_by:
        whole["caused_by"] = list(caused_by)
    expected = json.dumps(whole, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    assert message_to_json(participant, content, metadata, timestamp_ms, caused_by) == expected


def test_storage_form_refuses_what_json_cant_hold_as_the_encoder_does():
    with pytest.raises(ValueError, match="Out of range float"):
        message_to_json("a", (Text("x"),), {"n": float("nan")}, 0, ())
    with pytest.raises(TypeError, match="not JSON serializable"):
        message_to_json("a", (ToolUse("t", "n", {"s": {1}}),), None, 0, ())


@settings(max_examples=200, deadline=None)
@given(content=stored_blocks)
def test_valid_blocks_pass_ingress_unchanged(content):
    """M6: validating already-valid blocks returns equal blocks (validation only normalises)."""
    assert blocks_from_content(content) == content


def _media_sources(blocks):
    for block in blocks:
        if isinstance(block, (Image, Document)):
            yield block.source
        elif isinstance(block, ToolResult) and not isinstance(block.content, str):
            yield from _media_sources(block.content)


@settings(max_examples=200, deadline=None)
@given(content=stored_blocks)
def test_blob_extraction_and_resolution_round_trip(content):
    """M4: base64 media extracted to blob refs and resolved again gives back the same blocks."""
    stored, blobs = extract_blobs(content)
    table = {digest: (raw, media_type) for digest, raw, media_type in blobs}
    assert all(hashlib.sha256(raw).hexdigest() == digest for digest, (raw, _) in table.items())
    assert not any(source["type"] == "base64" for source in _media_sources(stored))
    assert resolve_blobs(stored, table.get) == content


@settings(max_examples=200, deadline=None)
@given(content=st.lists(block_strategy(with_audience=False, with_raw=False), min_size=1, max_size=5).map(tuple))
def test_api_form_round_trips_blocks_without_audience_or_raw(content):
    """P7: block_to_api then blocks_from_api gives back the blocks (audience and raw never reach the API form)."""
    assert blocks_from_api([block_to_api(b) for b in content]) == content


# --------------------------------------------------------------------------------------------
# Blobs
# --------------------------------------------------------------------------------------------


def test_identical_media_is_extracted_once():
    """M4, M13: the same bytes in two places (one nested in a tool result) make one blob; each
    reference names its size, so a cache holding it needs no read to price or describe it."""
    image = Image({"type": "base64", "media_type": "image/png", "data": PNG})
    stored, blobs = extract_blobs((image, ToolResult("t", (image,)), Image({"type": "url", "url": "https://x"})))
    digest = hashlib.sha256(base64.b64decode(PNG)).hexdigest()
    assert blobs == [(digest, base64.b64decode(PNG), "image/png")]
    ref = {"type": "blob_ref", "sha256": digest, "media_type": "image/png", "size": len(base64.b64decode(PNG))}
    assert stored == (Image(ref), ToolResult("t", (Image(ref),)), Image({"type": "url", "url": "https://x"}))


def test_invalid_base64_in_extraction_names_the_data_path():
    """M4: extract_blobs refuses invalid base64 at the block's data path."""
    bad = Document({"type": "base64", "media_type": "application/pdf", "data": "@@@"})
    with pytest.raises(MalformedContentError) as info:
        extract_blobs((Text("a"), ToolResult("t", (bad,))))
    assert info.value.path == "content[1].content[0].source.data"


def test_missing_blob_leaves_the_ref_and_renders_as_a_notice():
    """M4: a blob that can't be found never fails the read; the API form says the media is missing."""
    ref = Image({"type": "blob_ref", "sha256": "ab" * 32, "media_type": "image/png"})
    assert resolve_blobs((ref,), lambda _: None) == (ref,)
    assert block_to_api(ref) == {"type": "text", "text": f"[image unavailable: stored media {'ab' * 32} is missing]"}


def test_blocks_without_media_pass_extraction_untouched():
    """M4: content with no base64 media yields no blobs and equal blocks."""
    content = (Text("a"), ToolUse("t", "n", {}))
    assert extract_blobs(content) == (content, [])


# --------------------------------------------------------------------------------------------
# API form
# --------------------------------------------------------------------------------------------


def test_api_form_drops_audience_and_raw_but_keeps_cache_control():
    """A8: no API block carries an audience or raw; a text block's cache_control is kept."""
    block = Text("hi", audience=("bob",), cache_control={"type": "ephemeral"}, raw={"x": 1})
    assert block_to_api(block) == {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}
    assert block_to_api(Thinking("t", "s", audience=("bob",), raw=1)) == {"type": "thinking", "thinking": "t", "signature": "s"}


def test_blocks_from_api_is_lenient_with_model_responses():
    """P7: response blocks ctxrt does not keep are skipped, extra fields ignored, SDK objects accepted."""
    from anthropic.types import TextBlock, ToolUseBlock

    blocks = blocks_from_api(
        [
            TextBlock(type="text", text="hi", citations=None),
            {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}},
            ToolUseBlock(type="tool_use", id="t", name="n", input={"a": 1}),
            {"type": "text", "text": "x", "citations": [{"type": "char_location"}]},
        ]
    )
    assert blocks == (Text("hi"), ToolUse("t", "n", {"a": 1}), Text("x"))


# --------------------------------------------------------------------------------------------
# The private converter
# --------------------------------------------------------------------------------------------


@attrs.frozen
class _Record:
    name: str
    blocks: tuple[Block, ...]
    parent: str | None = None


def test_records_holding_blocks_round_trip_through_the_private_converter():
    """R2: attrs records other modules persist (with blocks inside) round-trip through to_jsonable/from_jsonable."""
    record = _Record("s1", (Text("a", audience=("bob",)), ToolResult("t", (Text("r"),), is_error=True)))
    data = to_jsonable(record)
    assert json.loads(json.dumps(data)) == data
    assert data["blocks"][0] == {"type": "text", "text": "a", "audience": ["bob"]}
    assert from_jsonable(_Record, data) == record


def test_converter_is_private():
    """DESIGN §2: the codec's converter is its own, never cattrs' global converter: using it leaves
    the global one as cattrs made it (a block unstructured field by field, not in storage form)."""
    assert to_jsonable(Text("a")) == {"type": "text", "text": "a"}
    assert from_jsonable(Text, {"type": "text", "text": "a"}) == Text("a")
    assert cattrs.global_converter.unstructure(Text("a")) == cattrs.Converter().unstructure(Text("a"))
    assert cattrs.global_converter.unstructure(Text("a")) != to_jsonable(Text("a"))


def test_two_calls_of_one_message_with_one_id_are_refused_naming_the_second():
    """M6, P4, P8 (from a host-style attack): a message may not hold two tool calls with one id
    (no rendering could tell which call a result answers; OpenAI bodies broke their rules)."""
    call = {"type": "tool_use", "id": "t1", "name": "calc", "input": {}}
    with pytest.raises(MalformedContentError, match=r"^content\[1\]\.id: 't1' is also content\[0\]'s"):
        blocks_from_content([call, {**call, "name": "search"}])
    assert len(blocks_from_content([call, {**call, "id": "t2"}])) == 2
