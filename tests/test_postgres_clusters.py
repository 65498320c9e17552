"""Stores across servers (issue 39 item 5, K15): a host whose conversations live on two clusters
opens one runtime per URL and routes each conversation to one store by a stable hash of its id;
readers on both clusters read each conversation where the hash put it, and only there."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

import pytest
import trio

import ctxrt
from ctxrt.errors import UnknownStateError
from ctxrt.testing import Cluster, temporary_cluster

GUARD_S = 120
CONVERSATIONS = [f"conversation-{n}" for n in range(8)]


@pytest.fixture(scope="module")
def second_cluster() -> Iterator[Cluster]:
    with temporary_cluster() as cluster:
        yield cluster


def store_of(conversation: str, urls: Sequence[str]) -> str:
    """The store a conversation lives in: a stable hash of its id (the same in every process and
    run, unlike Python's ``hash``), so every host and reader finds it in the same one."""
    digest = hashlib.blake2b(conversation.encode(), digest_size=8).digest()
    return urls[int.from_bytes(digest, "big") % len(urls)]


async def test_a_host_routes_conversations_to_stores_on_two_servers_and_readers_on_both_find_them(
    pg_url: str, second_cluster: Cluster,
) -> None:
    """K15: one runtime per URL; each conversation (an isolated namespace) is written to the store its
    id hashes to, and a fork of it is made there; a read-only runtime on each server reads exactly the
    conversations routed to it, with their messages and forks; the other store knows neither."""
    urls = [pg_url, second_cluster.create_database("clusters_second")]
    routed = {url: [c for c in CONVERSATIONS if store_of(c, urls) == url] for url in urls}
    assert all(routed.values()), "the ids chosen land on both stores"
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(urls[0]) as first, ctxrt.open_runtime(urls[1]) as second:
            runtimes = dict(zip(urls, (first, second), strict=True))
            for conversation in CONVERSATIONS:
                runtime = runtimes[store_of(conversation, urls)]
                manager = await runtime.open(conversation, isolate=True)
                for n in range(3):
                    await manager.add_message("user", f"{conversation} says {n}")
                await manager.fork(f"{conversation}-fork")  # a fork stays in its conversation's store
        for url in urls:
            async with ctxrt.open_runtime(url, readonly=True) as reader:
                branches = {info.name for info in await reader.list_branches()}
                assert branches == {"main", *(f"{c}-fork" for c in routed[url])}
                for conversation in CONVERSATIONS:
                    if conversation in routed[url]:
                        manager = await reader.open(conversation, isolate=True)
                        texts = [block.text for m in await manager.get_all_messages()
                                 for block in m.content if isinstance(block, ctxrt.Text)]
                        assert texts == [f"{conversation} says {n}" for n in range(3)]
                    else:
                        with pytest.raises(UnknownStateError):
                            await reader.open(conversation, isolate=True)
