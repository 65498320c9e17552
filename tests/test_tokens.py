"""ctxrt.content.tokens: the content-class-aware estimator (P2)."""

from __future__ import annotations

import json
import math

import pytest

from ctxrt import Document, Image, Message, RedactedThinking, Text, Thinking, ToolResult, ToolUse
from ctxrt.testing import estimate_block, estimate_blocks, estimate_message, estimate_text
from ctxrt.content.tokens import DOCUMENT_TOKEN_ESTIMATE, IMAGE_TOKEN_ESTIMATE, REDACTED_DEFAULT_TOKENS


def test_prose_costs_one_token_per_2_9_chars():
    """P2: prose text is priced at ceil(len / 2.9)."""
    text = "The quick brown fox jumps over the lazy dog. " * 10
    assert estimate_text(text) == math.ceil(len(text) / 2.9)


def test_dense_text_costs_one_token_per_2_3_chars():
    """P2: JSON-like text (over 12% dense characters) is priced at ceil(len / 2.3)."""
    text = json.dumps({"key_name": [1, 2, {"path": "/a/b"}]}) * 5
    assert estimate_text(text) == math.ceil(len(text) / 2.3)


def test_density_threshold_is_strictly_more_than_twelve_percent():
    """P2: exactly 12% dense characters is still prose; one more makes the text dense."""
    at = "{" * 12 + "a" * 88
    over = "{" * 13 + "a" * 87
    assert estimate_text(at) == math.ceil(100 / 2.9)
    assert estimate_text(over) == math.ceil(100 / 2.3)


def test_non_ascii_characters_count_as_dense():
    """P2: non-ASCII text (e.g. CJK) is priced as dense."""
    text = "日本語のテキストです" * 10
    assert estimate_text(text) == math.ceil(len(text) / 2.3)


def test_density_is_judged_on_the_first_2000_characters_only():
    """P2: dense characters after the first 2000 don't make prose dense."""
    text = "a" * 2000 + "{" * 2000
    assert estimate_text(text) == math.ceil(4000 / 2.9)


def test_empty_text_costs_nothing():
    """P2: an empty text block is free."""
    assert estimate_block(Text("")) == 0


def test_signed_thinking_costs_at_least_its_signature():
    """P2: thinking with a signature costs max(text tokens, round(len(signature) / 3.3))."""
    assert estimate_block(Thinking("short", "s" * 330)) == 100
    assert estimate_block(Thinking("x" * 2900, "s" * 33)) == 1000
    assert estimate_block(Thinking("x" * 29)) == 10


def test_redacted_thinking_costs_a_sixth_of_its_data_rounding_halves_up():
    """P2: redacted thinking costs round(len(data) / 6) (halves up, as JS Math.round), or 600 without data."""
    assert estimate_block(RedactedThinking("d" * 600)) == 100
    assert estimate_block(RedactedThinking("d" * 3)) == 1
    assert estimate_block(RedactedThinking("")) == REDACTED_DEFAULT_TOKENS == 600


def test_tool_use_costs_its_compact_json_input_plus_twenty():
    """P2: tool_use costs ceil(len(compact JSON of input) / 2.3) + 20, non-ASCII written as is."""
    tool_input = {"query": "café", "n": [1, 2]}
    compact = '{"query":"café","n":[1,2]}'
    assert estimate_block(ToolUse("t", "search", tool_input)) == math.ceil(len(compact) / 2.3) + 20


def test_tool_result_costs_its_string_or_its_nested_blocks():
    """P2: a string tool_result costs ceil(len / 2.3); a list costs the sum of its blocks; empty costs 0."""
    assert estimate_block(ToolResult("t", "x" * 23)) == 10
    nested = (Text("y" * 29), Image({"type": "url", "url": "https://x"}))
    assert estimate_block(ToolResult("t", nested)) == 10 + IMAGE_TOKEN_ESTIMATE
    assert estimate_block(ToolResult("t", ())) == 0


@pytest.mark.parametrize(
    "source",
    [
        {"type": "base64", "media_type": "image/png", "data": "AAAA"},
        {"type": "url", "url": "https://x"},
        {"type": "blob_ref", "sha256": "0" * 64, "media_type": "image/png"},
    ],
)
def test_images_cost_the_named_constant_whatever_their_source(source):
    """P2: an image (inline, url, or stored as a blob ref) costs IMAGE_TOKEN_ESTIMATE."""
    assert estimate_block(Image(source)) == IMAGE_TOKEN_ESTIMATE == 1600


def test_documents_cost_a_thousand():
    """P2: a document (inline or blob ref) costs 1000."""
    assert estimate_block(Document({"type": "blob_ref", "sha256": "0" * 64, "media_type": "application/pdf"})) == DOCUMENT_TOKEN_ESTIMATE == 1000


def test_estimate_blocks_sums_per_block_estimates():
    """P2: a block list costs the sum of its blocks, each rounded on its own."""
    blocks = (Text("a"), Text("b"), ToolResult("t", "c"))
    assert estimate_blocks(blocks) == 3


def test_message_estimate_is_memoised_without_changing_the_message():
    """P2: a message's estimate, kept on the message once made, changes neither its equality, its
    hash nor its repr, and is the same on every call."""
    message = Message("1", 1, "Alice", (Text("x" * 29), ToolResult("t", "y" * 23)))
    twin = Message("1", 1, "Alice", message.content)
    before = repr(message)
    assert estimate_message(message) == 20
    assert estimate_message(message) == 20
    assert message == twin and hash(message) == hash(twin) and repr(message) == before == repr(twin)
