"""K10, C6: the audience flag and index entries prepare_append gives Appended equal what Appended
derives itself, over a grid of contents and metadata."""
import itertools
from ctxrt.slots import prepare_append
from ctxrt.content.blocks import holds_audience
from ctxrt.channel_entries import index_entries
from ctxrt import Text
import ctxrt

contents = ["plain", "", [Text("x")], [Text("x", audience=["ann"])], [Text("a"), Text("b", audience=["bob"])],
            [ctxrt.ToolResult("t1", [Text("in", audience=["ann"])])] if hasattr(ctxrt, "ToolResult") else [Text("y")]]
metas = [None, {}, {"channel_id": "c"}, {"channel_id": ""}, {"channel_id": 5}, {"channel": "x", "channel_id": "d"}]
bad = n = 0
for content, meta in itertools.product(contents, metas):
    try:
        _, _, a = prepare_append("user", content, meta, (), 1000)
    except Exception as exc:
        print("refused", repr(content)[:40], meta, type(exc).__name__); continue
    n += 1
    if a.audience != holds_audience(a.content) or a.index != index_entries(a.content, a.metadata, a.timestamp_ms):
        bad += 1; print("MISMATCH", content, meta, a.audience, a.index)
print("cases", n, "bad", bad)
