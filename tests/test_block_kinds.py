"""The block kinds hosts store beside text and tools (docs/behaviours.md M8): ``Audio``, ``Video``,
``GeneratedImage``, ``ToolAttempt``, ``ToolNotice`` and the optional fields of ``ToolResult``,
``ToolUse``, ``Image`` and ``Document``: checked at the edge, stored (media once, M4), read back
as written, priced, rendered in the three request forms within their rules, kept from readers
outside their audience, and shown by compression requests (the inspector's timeline:
tests/test_inspector.py).

Property tests build content as a host hands it in (dicts, checked by ``blocks_from_content``);
stored-form tests go through the codec and blob walk ``ctxrt.testing`` exposes; the rest through
the public API on a real store.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxrt
from ctxrt import (
    Audio,
    Budget,
    CompiledMessage,
    Document,
    GeneratedImage,
    Image,
    Text,
    ToolAttempt,
    ToolNotice,
    ToolResult,
    ToolUse,
    Video,
    content_for_reader,
)
from ctxrt.anthropic_rules import violations as anthropic_violations
from ctxrt.openai_rules import violations as openai_violations
from ctxrt.testing import (
    ScriptedModel,
    blocks_from_content,
    codec,
    estimate_block,
    extract_blobs,
    keys,
    resolve_blobs,
    to_anthropic_messages,
)

GUARD_S = 30
BIG = Budget(max_tokens=10_000_000, reserve_for_response=0)
WAV = base64.b64encode(b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(range(40))).decode()
MP4 = base64.b64encode(b"\x00\x00\x00\x18ftypmp42" + bytes(range(30))).decode()
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(60))).decode()
NEW_TYPES = ("audio", "video", "generated_image", "tool_attempt", "tool_notice")


# --------------------------------------------------------------------------------------------
# Content as hosts hand it in
# --------------------------------------------------------------------------------------------

texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=24)
readers = st.none() | st.lists(st.sampled_from(["ann", "bob"]), min_size=1, max_size=2, unique=True)
data = st.binary(min_size=1, max_size=48).map(lambda raw: base64.b64encode(raw).decode())
urls = st.sampled_from(["https://example.com/media/1", "http://example.org/x.bin", "s3://bucket/key"])
json_inputs = st.dictionaries(st.text(max_size=6), st.none() | st.booleans() | st.integers(-99, 99) | texts,
                              max_size=3)


def source(media_types: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return (st.builds(lambda media_type, encoded: {"type": "base64", "media_type": media_type, "data": encoded},
                      st.sampled_from(media_types), data)
            | urls.map(lambda url: {"type": "url", "url": url}))


def block(tag: str, **fields: Any) -> dict[str, Any]:
    """A block dict with the fields that aren't None (a host leaves optional ones out)."""
    return {"type": tag, **{key: value for key, value in fields.items() if value is not None}}


durations = st.none() | st.integers(0, 10**6) | st.floats(0, 1e6, allow_nan=False, allow_infinity=False)
audio = st.builds(lambda s, d, t, a: block("audio", source=s, duration=d, transcript=t, audience=a),
                  source(["audio/wav", "audio/mpeg", "audio/mp3", "audio/ogg", "audio/x-wav"]), durations,
                  st.none() | texts, readers)
video = st.builds(lambda s, d, t, a: block("video", source=s, duration=d, transcript=t, audience=a),
                  source(["video/mp4", "video/webm"]), durations, st.none() | texts, readers)
generated = st.builds(
    lambda s, p, v, e, a: block("generated_image", source=s, prompt=p, is_preview=v, token_estimate=e, audience=a),
    source(["image/png", "image/jpeg", "image/webp"]), st.none() | texts, st.none() | st.booleans(),
    st.none() | st.integers(0, 10**6), readers)
attempt = st.builds(
    lambda n, i, x, r, a: block("tool_attempt", name=n, input=i, raw_xml=x if x is not None or n else "<fc/>",
                                reason=r, audience=a),
    st.none() | st.sampled_from(["search", "mcpl:fetch", "run code"]), st.none() | json_inputs, st.none() | texts,
    st.none() | texts, readers)
notice = st.builds(lambda ns, n, a: block("tool_notice", notices=ns, tool_name=n, audience=a),
                   st.lists(texts.filter(str.strip), min_size=1, max_size=3), st.none() | texts, readers)
image = st.builds(lambda s, e, u: block("image", source=s, token_estimate=e, source_url=u),
                  source(["image/png", "image/gif"]), st.none() | st.integers(0, 10**6), st.none() | urls)
document = st.builds(
    lambda encoded, title, name: block("document", source={"type": "base64", "media_type": "application/pdf",
                                                           "data": encoded}, title=title, filename=name),
    data, st.none() | texts, st.none() | texts)
new_kinds = audio | video | generated | attempt | notice


def tool_pair(n: int, name: str, raw_xml: str | None, unparsed: str | None, tool_name: str | None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    call = block("tool_use", id=f"call_{n}", name=name, input={"q": n}, raw_xml=raw_xml, unparseable_input=unparsed)
    return call, block("tool_result", tool_use_id=f"call_{n}", content="found it", tool_name=tool_name)


tool_pairs = st.builds(tool_pair, st.integers(0, 5), st.sampled_from(["search", "mcpl:fetch"]),
                       st.none() | texts, st.none() | texts, st.none() | texts)


def checked(content: list[dict[str, Any]]) -> tuple[ctxrt.Block, ...]:
    return blocks_from_content(content)


# --------------------------------------------------------------------------------------------
# The storage form
# --------------------------------------------------------------------------------------------


def stored_and_read(blocks: tuple[ctxrt.Block, ...]) -> tuple[ctxrt.Block, ...]:
    """``blocks`` written as a message is (media swapped for blob refs), read back and resolved."""
    stored, blobs = extract_blobs(blocks)
    table = {digest: (raw, media_type) for digest, raw, media_type in blobs}
    data = codec.message_to_json("user", stored, None, 0, ())
    message = codec.message_from_json(data, sequence=1, store="test")
    assert codec.message_to_json("user", message.content, None, 0, ()) == data
    return resolve_blobs(message.content, table.get)


@settings(max_examples=150, deadline=None)
@given(content=st.lists(new_kinds | image | document, min_size=1, max_size=6), pair=tool_pairs)
def test_every_new_block_and_field_reads_back_as_written(content: list[dict[str, Any]], pair: Any) -> None:
    """M8, M4: every new kind and field, checked at the edge, stored (media as blobs) and read back, equals what was written."""
    blocks = checked([*content, *pair])
    assert stored_and_read(blocks) == blocks
    assert codec.from_jsonable(list[ctxrt.Block], codec.to_jsonable(list(blocks))) == list(blocks)


def test_a_message_stored_before_the_new_fields_reads_back_unchanged() -> None:
    """M8: a message in the storage form of an older store decodes with the new fields unset and encodes to the same bytes."""
    old = (
        '{"participant":"user","content":[{"type":"text","text":"hi"},'
        '{"type":"image","source":{"type":"blob_ref","sha256":"' + "ab" * 32 + '","media_type":"image/png"}},'
        '{"type":"document","source":{"type":"text","media_type":"text/plain","data":"d"},"title":"T"},'
        '{"type":"tool_use","id":"t1","name":"mcpl:search","input":{"q":[1,2]}},'
        '{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"r"}],"is_error":true}],'
        '"metadata":{"k":1},"timestamp_ms":5}'
    ).encode()
    message = codec.message_from_json(old, sequence=3, store="test")
    image_, document_, call, result = message.content[1:]
    assert isinstance(image_, Image) and (image_.token_estimate, image_.source_url) == (None, None)
    assert isinstance(document_, Document) and document_.filename is None
    assert isinstance(call, ToolUse) and (call.raw_xml, call.unparseable_input) == (None, None)
    assert isinstance(result, ToolResult) and result.tool_name is None
    assert codec.message_to_json(message.participant, message.content, message.metadata, message.timestamp_ms,
                                 message.caused_by) == old


def test_two_blocks_with_the_same_bytes_make_one_blob_whatever_their_kind() -> None:
    """M4, M8: base64 audio, video and generated images are kept as blob refs, the same bytes once."""
    blocks = checked([block("audio", source={"type": "base64", "media_type": "audio/wav", "data": WAV}),
                      block("video", source={"type": "base64", "media_type": "video/mp4", "data": MP4}),
                      block("generated_image", source={"type": "base64", "media_type": "image/png", "data": PNG}),
                      block("audio", source={"type": "base64", "media_type": "audio/wav", "data": WAV},
                            transcript="again")])
    stored, blobs = extract_blobs(blocks)
    assert sorted(media_type for _, _, media_type in blobs) == ["audio/wav", "image/png", "video/mp4"]
    assert all(getattr(b, "source")["type"] == "blob_ref" for b in stored)


# --------------------------------------------------------------------------------------------
# Checked at the edge
# --------------------------------------------------------------------------------------------

AUDIO_SOURCE = {"type": "base64", "media_type": "audio/wav", "data": WAV}
REFUSED = [
    ([block("audio", source={"type": "base64", "media_type": "image/png", "data": WAV})], "content[0].source.media_type"),
    ([block("video", source={"type": "base64", "media_type": "audio/wav", "data": WAV})], "content[0].source.media_type"),
    ([block("audio", source={"type": "base64", "media_type": "audio/wav", "data": "not base64!"})], "content[0].source.data"),
    ([block("audio", source=AUDIO_SOURCE, duration="12 s")], "content[0].duration"),
    ([block("audio", source=AUDIO_SOURCE, duration=-1)], "content[0].duration"),
    ([block("video", source={"type": "url", "url": "https://x"}, duration=float("nan"))], "content[0].duration"),
    ([block("audio", source=AUDIO_SOURCE, transcript=5)], "content[0].transcript"),
    ([block("video", source={"type": "url", "url": "https://x"}, fps=30)], "content[0].fps"),
    ([block("audio")], "content[0].source"),
    ([block("generated_image", source={"type": "base64", "media_type": "image/bmp", "data": PNG})],
     "content[0].source.media_type"),
    ([block("generated_image", source={"type": "url", "url": "https://x"}, is_preview="yes")], "content[0].is_preview"),
    ([block("generated_image", source={"type": "url", "url": "https://x"}, token_estimate=-1)],
     "content[0].token_estimate"),
    ([block("image", source={"type": "url", "url": "https://x"}, token_estimate=True)], "content[0].token_estimate"),
    ([block("image", source={"type": "url", "url": "https://x"}, token_estimate=1.5)], "content[0].token_estimate"),
    ([block("image", source={"type": "url", "url": "https://x"}, source_url=3)], "content[0].source_url"),
    ([block("document", source={"type": "text", "media_type": "text/plain", "data": "d"}, filename=[])],
     "content[0].filename"),
    ([block("tool_use", id="t", name="n", input={}, raw_xml=1)], "content[0].raw_xml"),
    ([block("tool_use", id="t", name="n", input={}, unparseable_input={"a": 1})], "content[0].unparseable_input"),
    ([block("tool_result", tool_use_id="t", content="r", tool_name=7)], "content[0].tool_name"),
    ([block("tool_attempt", reason="refused")], "content[0].name"),
    ([block("tool_attempt", name="")], "content[0].name"),
    ([block("tool_attempt", name="n", input=[1])], "content[0].input"),
    ([block("tool_attempt", raw_xml="<x/>", input={"f": float("inf")})], "content[0].input.f"),
    ([block("tool_notice", notices=[])], "content[0].notices"),
    ([block("tool_notice", notices="one")], "content[0].notices"),
    ([block("tool_notice", notices=["ok", 3])], "content[0].notices[1]"),
    ([block("tool_notice", notices=["ok"], tool_name=False)], "content[0].tool_name"),
    ([block("tool_notice", notices=["ok"], audience=[])], "content[0].audience"),
    ([block("audio", source=AUDIO_SOURCE, audience=["ann", ""])], "content[0].audience[1]"),
    ([block("tool_result", tool_use_id="t", content=[block("audio", source=AUDIO_SOURCE)])], "content[0].content[0].type"),
    ([block("tool_result", tool_use_id="t", content=[block("tool_notice", notices=["x"])])],
     "content[0].content[0].type"),
]


@pytest.mark.parametrize(("content", "path"), REFUSED)
def test_a_bad_field_of_a_new_kind_is_refused_naming_its_place(content: list[dict[str, Any]], path: str) -> None:
    """M8, M6, B1: a malformed new block or field raises MalformedContentError whose path names it."""
    with pytest.raises(ctxrt.MalformedContentError) as refused:
        blocks_from_content(content)
    assert refused.value.path == path


async def test_a_refused_new_block_stores_nothing(runtime: ctxrt.Runtime) -> None:
    """M8, M6: add_message refuses a bad tool_notice before writing: the slot is as it was."""
    with trio.fail_after(GUARD_S):
        m = await runtime.open("a")
        await m.add_message("user", "before")
        with pytest.raises(ctxrt.MalformedContentError) as refused:
            await m.add_message("user", [block("text", text="x"), block("tool_notice", notices=["ok", None])])
        assert refused.value.path == "content[1].notices[1]"
        assert [b.type for msg in await m.get_all_messages() for b in msg.content] == ["text"]


def test_image_token_estimate_wins_and_the_new_kinds_are_priced() -> None:
    """M8, P2: an image's or generated image's token_estimate replaces the flat figure; audio and video cost at least 1,000; attempts and notices their note."""
    url = {"type": "url", "url": "https://example.com/a.png"}
    assert estimate_block(Image(url, token_estimate=42)) == 42
    assert estimate_block(Image(url)) == 1600
    assert estimate_block(GeneratedImage(url, token_estimate=7)) == 7
    assert estimate_block(GeneratedImage(url)) == 1600
    assert estimate_block(Audio(url)) == 1000
    long = Audio(url, transcript="word " * 2000)
    assert estimate_block(long) > 3000
    assert 0 < estimate_block(ToolNotice(("tool disabled",))) < estimate_block(ToolNotice(("tool disabled " * 50,)))
    assert estimate_block(ToolAttempt("search", {"q": "x" * 300})) > 100


# --------------------------------------------------------------------------------------------
# Request forms
# --------------------------------------------------------------------------------------------


def result_of(messages: list[CompiledMessage]) -> ctxrt.CompileResult:
    provenance = ctxrt.Provenance("c", "ns", "main", None, "passthrough", tuple(() for _ in messages), {}, {})
    return ctxrt.CompileResult(messages, [], provenance)


def bodies(messages: list[CompiledMessage]) -> tuple[dict[str, Any], ctxrt.OpenAIBody, ctxrt.OpenAIBody]:
    """The three forms, each made from cached parts and checked against one made afresh and the rules (strict)."""
    result = result_of(messages)
    return (result.to_anthropic(assistant="ann", strict=True), result.to_openai_chat(assistant="ann", strict=True),
            result.to_openai_responses(assistant="ann", strict=True))


turns = st.lists(
    st.tuples(st.sampled_from(["ann", "bob", "user"]), st.lists(new_kinds | image | document, max_size=4))
    | tool_pairs.map(lambda pair: ("pair", list(pair))),
    min_size=1, max_size=6,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(talk=turns, reader=st.sampled_from(["ann", "bob", None]))
def test_every_new_kind_renders_in_all_three_forms_within_their_rules(talk: list[Any], reader: str | None) -> None:
    """M8, P8, P11: any mix of the new kinds and fields renders in the Messages API, Chat Completions and Responses forms with no rule broken; video, tool attempts and notices are always notes, counted in as_text."""
    messages: list[CompiledMessage] = []
    for n, (who, content) in enumerate(talk):
        if who == "pair":
            call, answer = content
            messages.append(CompiledMessage("ann", content_for_reader(checked([block("text", text=f"call {n}"), call]), reader)))
            messages.append(CompiledMessage("user", content_for_reader(checked([answer, block("text", text=f"after {n}")]), reader)))
        else:
            messages.append(CompiledMessage(who, content_for_reader(checked([block("text", text=f"turn {n}"), *content]), reader)))
    anthropic, chat, responses = bodies(messages)
    assert anthropic_violations(anthropic) == []
    assert openai_violations(chat, api="chat") == []
    assert openai_violations(responses, api="responses") == []
    for kind in ("video", "tool_attempt", "tool_notice"):
        count = sum(type(b).type == kind for m in messages for b in m.content)
        assert chat.as_text.get(kind, 0) == responses.as_text.get(kind, 0) == count
    shown = json.dumps([anthropic, chat, responses])
    assert '"audience"' not in shown and "raw_xml" not in shown and "unparseable_input" not in shown


def test_each_form_sends_a_kind_natively_where_it_has_a_place_and_as_its_note_elsewhere() -> None:
    """M8, P10: audio wav is Chat's input_audio and a note elsewhere; a generated image an image in a user turn and a note in the assistant's; video, attempts and notices notes everywhere."""
    wav = Audio({"type": "base64", "media_type": "audio/wav", "data": WAV}, duration=12, transcript="hello there")
    drawn = GeneratedImage({"type": "base64", "media_type": "image/png", "data": PNG}, prompt="a cat")
    clip = Video({"type": "url", "url": "https://example.com/v.mp4"}, duration=3.5)
    tried = ToolAttempt("search", {"q": "x"}, reason="refused by policy")
    notice = ToolNotice(("search is disabled",), tool_name="search")
    messages = [
        CompiledMessage("user", (Text("look"), wav, drawn, clip, tried, notice)),
        CompiledMessage("ann", (Text("mine"), drawn, wav)),
    ]
    anthropic, chat, responses = bodies(messages)
    user, assistant = anthropic["messages"]
    assert user["content"] == [
        {"type": "text", "text": "look"},
        {"type": "text", "text": "[audio: 12 s, audio/wav, transcript: hello there]"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "text", "text": "[video: 3.5 s, https://example.com/v.mp4]"},
        {"type": "text", "text": '[tool call not run: search {"q":"x"}; reason: refused by policy]'},
        {"type": "text", "text": "[tool notice (search): search is disabled]"},
    ]
    assert assistant["content"][1:] == [{"type": "text", "text": "[generated image: image/png, prompt: a cat]"},
                                        {"type": "text", "text": "[audio: 12 s, audio/wav, transcript: hello there]"}]
    parts = chat["messages"][0]["content"]
    assert parts[1] == {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}}
    assert parts[2] == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    assert chat.as_text == {"video": 1, "tool_attempt": 1, "tool_notice": 1, "generated_image": 1, "audio": 1}
    assert [p["type"] for p in responses["input"][0]["content"]] == [
        "input_text", "input_text", "input_image", "input_text", "input_text", "input_text"]
    assert responses.as_text == {"audio": 2, "video": 1, "tool_attempt": 1, "tool_notice": 1, "generated_image": 1}


def test_the_chat_rules_check_an_input_audio_part() -> None:
    """M8, P11: ctxrt.openai_rules refuses an input_audio part in another format, without data, with an unknown field, or outside a user message."""
    def found(part: dict[str, Any], role: str = "user") -> list[str]:
        return openai_violations({"messages": [{"role": role, "content": [{"type": "text", "text": "x"}, part]}]},
                                 api="chat")

    assert found({"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}}) == []
    assert [v.split(":")[0] for v in found({"type": "input_audio", "input_audio": {"data": "", "format": "ogg",
                                                                                   "rate": 1}})] == [
        "messages[0].content[1].input_audio.rate", "messages[0].content[1].input_audio.data",
        "messages[0].content[1].input_audio.format"]
    [refused] = found({"type": "input_audio", "input_audio": {"data": WAV, "format": "mp3"}}, "assistant")
    assert refused.startswith("messages[0].content[1].type: ") and "input_audio" in refused


def test_a_tool_use_sends_its_input_as_given_and_keeps_its_raw_forms_for_the_host() -> None:
    """M8, P4: raw_xml and unparseable_input stay in the store; the call still pairs with its result (tool_name not sent)."""
    call = ToolUse("t1", "search", {}, raw_xml="<invoke name='search'>", unparseable_input="{q: oops")
    answer = ToolResult("t1", "nothing", tool_name="search")
    anthropic, chat, responses = bodies([CompiledMessage("ann", (call,)), CompiledMessage("user", (answer,))])
    assert anthropic["messages"][1]["content"][0] == {"type": "tool_use", "id": "t1", "name": "search", "input": {}}
    assert chat["messages"][0]["tool_calls"][0]["function"] == {"name": "search", "arguments": "{}"}
    assert chat["messages"][1] == {"role": "tool", "tool_call_id": "t1", "content": "nothing"}
    assert [item["type"] for item in responses["input"]] == ["function_call", "function_call_output"]


def test_image_and_document_fields_name_them_where_a_form_shows_a_note() -> None:
    """M8, P10: an assistant's image note names its source_url; a PDF file part is sent under its filename."""
    pdf = Document({"type": "base64", "media_type": "application/pdf", "data": PNG}, title="Report", filename="r.pdf")
    picture = Image({"type": "base64", "media_type": "image/png", "data": PNG}, source_url="https://example.com/p.png")
    _, chat, responses = bodies([CompiledMessage("user", (Text("see"), pdf)), CompiledMessage("ann", (Text("x"), picture))])
    assert chat["messages"][0]["content"][1]["file"]["filename"] == "r.pdf"
    assert responses["input"][0]["content"][1]["filename"] == "r.pdf"
    assert chat["messages"][1]["content"] == "x\n\n[image: https://example.com/p.png]"


def test_a_missing_blob_or_an_oversized_generated_image_is_its_note() -> None:
    """M8, M4, P8: a generated image whose blob is missing, or over the Messages API's 5 MB, is sent as its note; audio whose blob is missing too."""
    missing = GeneratedImage({"type": "blob_ref", "sha256": "ab" * 32, "media_type": "image/png"}, prompt="p")
    big = GeneratedImage({"type": "base64", "media_type": "image/png", "data": "A" * (5 * 1024 * 1024 + 4)})
    gone = Audio({"type": "blob_ref", "sha256": "cd" * 32, "media_type": "audio/wav"})
    anthropic, chat, _ = bodies([CompiledMessage("user", (Text("x"), missing, big, gone))])
    assert [b["type"] for b in anthropic["messages"][0]["content"]] == ["text"] * 4
    assert chat.as_text == {"generated_image": 2, "audio": 1}


# --------------------------------------------------------------------------------------------
# Through a store
# --------------------------------------------------------------------------------------------


@pytest.fixture(params=["lmdb", "postgres"])
async def rt(request: pytest.FixtureRequest, store_path: Path) -> AsyncIterator[ctxrt.Runtime]:
    store = store_path if request.param == "lmdb" else request.getfixturevalue("pg_url")
    async with ctxrt.open_runtime(store, durability="os") as runtime:
        yield runtime


def for_readers() -> list[dict[str, Any]]:
    """A message holding every new kind, some for ann, some for bob, each carrying its marker."""
    return [
        block("text", text="hello, both"),
        block("audio", source=AUDIO_SOURCE, transcript="ANN-ONLY-1", audience=["ann"]),
        block("video", source={"type": "url", "url": "https://example.com/v"}, transcript="BOB-ONLY-2",
              audience=["bob"]),
        block("generated_image", source={"type": "base64", "media_type": "image/png", "data": PNG},
              prompt="ANN-ONLY-3", audience=["ann"]),
        block("tool_attempt", name="search", reason="BOB-ONLY-4", audience=["bob"]),
        block("tool_notice", notices=["ANN-ONLY-5"], audience=["ann"]),
        block("tool_notice", notices=["BOTH-6"], audience=["ann", "bob"]),
    ]


async def test_a_reader_outside_a_new_blocks_audience_never_sees_it_in_a_compile_or_any_form(rt: ctxrt.Runtime) -> None:
    """M8, A2, A7, A8: new blocks with an audience reach only their readers' compiles and bodies, without the field; reads return them with it."""
    with trio.fail_after(GUARD_S):
        managers = {reader: await rt.open(f"agents/{reader}", view_reader=reader) for reader in ("ann", "bob")}
        managers["nobody"] = await rt.open("agents/nobody")
        mid = await managers["ann"].add_message("user", for_readers())
        stored = await managers["nobody"].get_message(mid)
        assert [getattr(b, "audience", None) for b in stored.content] == [
            None, ("ann",), ("bob",), ("ann",), ("bob",), ("ann",), ("ann", "bob")]
        for reader, manager in managers.items():
            result = await manager.compile(BIG)
            shown = json.dumps([result.to_anthropic(assistant="x", strict=True),
                                result.to_openai_chat(assistant="x", strict=True),
                                result.to_openai_responses(assistant="x", strict=True)])
            compiled = [b for m in result.messages for b in m.content]
            assert all(getattr(b, "audience", None) is None for b in compiled)
            assert '"audience"' not in shown
            for other in {"ann", "bob"} - {reader}:
                assert f"{other.upper()}-ONLY" not in shown + repr(compiled)
            if reader != "nobody":
                assert f"{reader.upper()}-ONLY" in shown and "BOTH-6" in shown
            else:
                assert "ONLY" not in shown and "BOTH" not in shown
            if reader != "ann":
                assert PNG not in shown  # ann's generated image, sent natively to her alone


async def test_the_same_audio_in_two_messages_is_one_blob_and_survives_the_others_removal(store_path: Path) -> None:
    """M8, M4: two messages holding the same audio store one blob; removing one keeps the other's, after a reopen too."""
    clip = Audio({"type": "base64", "media_type": "audio/wav", "data": WAV}, duration=2, transcript="hi")
    drawn = GeneratedImage({"type": "base64", "media_type": "image/png", "data": PNG}, prompt="p")

    def blob_count(runtime: ctxrt.Runtime) -> int:
        with runtime.engine.reader() as txn:
            return int(txn.stat(runtime.engine.dbs[keys.DB_BLOBS])["entries"])

    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store_path) as runtime:
            m = await runtime.open("a")
            first = await m.add_message("user", [Text("one"), clip])
            second = await m.add_message("user", [Text("two"), clip, drawn])
            assert blob_count(runtime) == 2
            await m.remove_message(first)
            assert (await m.get_message(second)).content == (Text("two"), clip, drawn)
        async with ctxrt.open_runtime(store_path) as runtime:
            m = await runtime.open("a")
            assert (await m.get_message(second)).content == (Text("two"), clip, drawn)
            assert (await m.compile(BIG)).messages[0].content == (Text("two"), clip, drawn)
            assert blob_count(runtime) == 2


async def test_compression_requests_show_every_new_kind_by_its_note_within_the_rules(store_path: Path) -> None:
    """M8, T4, P8: a chunk holding the new kinds is sent to the model with each one's note, in a body the Messages API accepts."""
    model = ScriptedModel(lambda request: "a memory")
    strategy = ctxrt.Autobiographical("model-x", target_chunk_tokens=40, recent_window_tokens=0,
                                      l1_holdback_chunks=0, summary_target_tokens=50)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store_path, model=model, durability="os") as runtime:
            m = await runtime.open("diary", strategy=strategy)
            await m.add_message("user", [block("text", text="what we heard"), block(
                "audio", source=AUDIO_SOURCE, duration=4, transcript="a song")])
            await m.add_message("Claude", [ToolAttempt("search", {"q": 1}, reason="refused"),
                                           ToolNotice(("search disabled",), tool_name="search")])
            await m.add_message("user", [Text("and saw"), Video({"type": "url", "url": "https://example.com/v"}),
                                         GeneratedImage({"type": "url", "url": "https://example.com/g"}, prompt="a cat")])
            for i in range(6):
                await m.add_message("user", f"filler message number {i} to close the chunk")
            assert await m.tick()
        [request] = model.requests[:1]
        text = "\n".join(b.text for msg in request.messages for b in msg.content if isinstance(b, Text))
        for note in ("[audio: 4 s, audio/wav, transcript: a song]", '[tool call not run: search {"q":1}; reason: refused]',
                     "[tool notice (search): search disabled]", "[video: https://example.com/v]",
                     "[generated image: https://example.com/g, prompt: a cat]"):
            assert note in text
        for request in model.requests:
            assert anthropic_violations({"messages": to_anthropic_messages(request.messages, request.assistant)}) == []
