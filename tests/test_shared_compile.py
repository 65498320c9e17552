"""What namespaces reading one slot in one reader view share of a compile (docs/behaviours.md P17).

Store-backed (a real LMDB store in a temp dir), through the public API: the compiled messages and
the request bodies' blocks of a message are the same objects in every such namespace, made once,
and a namespace that sees the message otherwise (another reader, a view filter) makes its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ctxrt
from ctxrt.testing import to_anthropic_messages

ASSISTANT = "Claude"


async def _managers(rt: ctxrt.Runtime) -> dict[str, Any]:
    return {
        "plain": await rt.open("plain"),
        "windowed": await rt.open("windowed", strategy=ctxrt.WindowedPassthrough()),
        "other": await rt.open("other"),
        "bob": await rt.open("bob-sees", view_reader="bob"),
        "filtered": await rt.open("filtered", view_filter=lambda message: True),
    }


async def test_namespaces_reading_one_slot_as_one_reader_compile_each_message_into_the_same_objects(
    store_path: Path,
) -> None:
    """P17: two namespaces (of different strategies, too) reading the slot as the same reader hand
    back the same compiled message and the same request blocks for a message; an edit makes new
    ones for both; another reader, or a view filter, gets its own."""
    async with ctxrt.open_runtime(store_path) as rt:
        managers = await _managers(rt)
        plain = managers["plain"]
        ids = [await plain.add_message("user" if k % 2 == 0 else ASSISTANT, f"message {k}") for k in range(6)]
        results = {name: await manager.compile() for name, manager in managers.items()}

        def compiled(name: str, message_id: str) -> Any:
            result = results[name]
            index = next(k for k, sources in enumerate(result.provenance.messages)
                         if any(source.id == message_id for source in sources))
            return result.messages[index]

        for message_id in ids[1:-1]:  # WindowedPassthrough marks its first and newest: its own twins
            assert compiled("plain", message_id) is compiled("windowed", message_id)
        for message_id in ids:
            assert compiled("plain", message_id) is compiled("other", message_id)
            assert compiled("plain", message_id) == compiled("filtered", message_id)
            assert compiled("plain", message_id) is not compiled("filtered", message_id)
        # Request bodies: an earlier turn's blocks are the same objects in both namespaces' bodies.
        bodies = {name: results[name].to_anthropic(assistant=ASSISTANT)["messages"] for name in ("plain", "other")}
        assert bodies["plain"] == bodies["other"]
        assert bodies["plain"][1]["content"][0] is bodies["other"][1]["content"][0]
        chats = {name: results[name].to_openai_chat(assistant=ASSISTANT) for name in ("plain", "other")}
        assert chats["plain"] == chats["other"]
        assert chats["plain"]["messages"][1] is chats["other"]["messages"][1]

        before = compiled("plain", ids[2])
        await plain.edit_message(ids[2], "message 2, edited")
        results = {name: await manager.compile() for name, manager in managers.items()}
        assert compiled("plain", ids[2]) is not before
        assert compiled("plain", ids[2]).content[0].text == "message 2, edited"
        assert compiled("plain", ids[2]) is compiled("other", ids[2])
        assert compiled("plain", ids[3]) is compiled("other", ids[3])

        # A block bob may not see: bob's namespace compiles its own projection of the message.
        hidden = await plain.add_message("user", [{"type": "text", "text": "for ann only", "audience": ["ann"]},
                                                  {"type": "text", "text": "for all"}])
        results = {name: await manager.compile() for name, manager in managers.items()}
        assert [block.text for block in compiled("bob", hidden).content] == ["for all"]
        assert compiled("bob", hidden) is not compiled("plain", hidden)
        assert compiled("plain", hidden) is compiled("other", hidden)


async def test_an_edit_of_a_shared_block_is_found_by_another_namespaces_strict_body_and_drops_every_cache(
    store_path: Path,
) -> None:
    """P17, P15: a host editing a block of an earlier turn (read-only) edits it for every namespace
    sharing the message; another namespace's ``strict=True`` body finds it, and from then on every
    namespace's bodies are made afresh: equal to ones made from scratch again."""
    async with ctxrt.open_runtime(store_path) as rt:
        plain, other = await rt.open("plain"), await rt.open("other")
        for k in range(6):
            await plain.add_message("user" if k % 2 == 0 else ASSISTANT, f"message {k}")
        mine, theirs = await plain.compile(), await other.compile()
        other_body = theirs.to_anthropic(assistant=ASSISTANT)
        body = mine.to_anthropic(assistant=ASSISTANT)
        body["messages"][1]["content"][0]["text"] = "the host wrote over a shared block"  # not allowed (P15)
        with pytest.raises(ctxrt.InvalidRequestError, match=r"messages\[1\]"):
            theirs.to_anthropic(assistant=ASSISTANT, strict=True)
        await plain.add_message("user", "after the edit")
        mine, theirs = await plain.compile(), await other.compile()
        for result in (mine, theirs):
            made = result.to_anthropic(assistant=ASSISTANT)["messages"]
            assert made == to_anthropic_messages(result.messages, ASSISTANT)
            assert made[1]["content"][0]["text"] == "message 1"
        assert other_body["messages"][1]["content"][0]["text"] == "the host wrote over a shared block"


async def test_a_host_edit_found_in_one_runtime_leaves_another_runtimes_bodies_cached(tmp_path: Path) -> None:
    """P17, P15: two runtimes in one process share no cache: one's strict body finding a host edit
    drops that runtime's bodies (its next one is made afresh), while the other's next body still
    starts from its last (an earlier turn's blocks are the same objects)."""
    async with ctxrt.open_runtime(tmp_path / "a") as a, ctxrt.open_runtime(tmp_path / "b") as b:
        managers = [await a.open("plain"), await b.open("plain")]
        for k in range(6):
            for manager in managers:
                await manager.add_message("user" if k % 2 == 0 else ASSISTANT, f"message {k}")
        mine, theirs = [await manager.compile() for manager in managers]
        before = theirs.to_anthropic(assistant=ASSISTANT)["messages"]
        body = mine.to_anthropic(assistant=ASSISTANT)
        body["messages"][1]["content"][0]["text"] = "the host wrote over a shared block"  # not allowed (P15)
        with pytest.raises(ctxrt.InvalidRequestError, match=r"messages\[1\]"):
            mine.to_anthropic(assistant=ASSISTANT, strict=True)
        assert mine.to_anthropic(assistant=ASSISTANT)["messages"][1]["content"][0]["text"] == "message 1"
        after = theirs.to_anthropic(assistant=ASSISTANT)["messages"]
        assert after == before
        assert after[1]["content"][0] is before[1]["content"][0]


async def test_what_a_reader_view_shares_lives_while_a_namespace_reads_the_slot_and_goes_with_the_last(
    store_path: Path,
) -> None:
    """P17: the compiled messages a reader view of a slot shares are kept while some namespace
    reads the slot so (one closing leaves them to the other), and dropped with the slot's cache
    when the last one closes: a namespace opened after that makes its own."""
    async with ctxrt.open_runtime(store_path) as rt:
        plain, other = await rt.open("plain"), await rt.open("other")
        message_id = await plain.add_message("user", "message 0")
        first = (await plain.compile()).messages[0]
        await plain.aclose()
        assert (await other.compile()).messages[0] is first
        await other.aclose()
        again = await rt.open("again")
        made = (await again.compile()).messages[0]
        assert made == first and made is not first
        assert (await again.compile()).provenance.messages[0][0].id == message_id
