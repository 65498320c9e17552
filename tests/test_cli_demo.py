"""The demo: what it deletes, when it fails, what it counts and what it tells you to run (issue 14 item 7).

Determinism: real LMDB in temp dirs; the CLI runs as real subprocesses; a real ``anthropic``
client talks to the local Messages API server (``ctxrt.testing.open_messages_api_server``) with
scripted replies; the real clock only under ``trio.fail_after`` guards.
"""

import json
import os
import shlex
import sys
from pathlib import Path

import pytest
import trio

import ctxrt
from ctxrt.cli.demo import invocation, relative
from ctxrt.demo import STORE_MARKER, DemoModelError, DemoStoreError, run_demo
from ctxrt import OfflineModel
from ctxrt.testing import ApiReply, open_messages_api_server

GUARD_S = 60


async def ctxrt_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[int, str, str]:
    result = await trio.run_process([sys.executable, "-m", "ctxrt", *args], capture_stdout=True,
                                    capture_stderr=True, check=False, env=env, cwd=cwd)
    return result.returncode, result.stdout.decode(), result.stderr.decode()


def environment(**changes: str) -> dict[str, str]:
    base = {key: value for key, value in os.environ.items()
            if key not in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "CTXRT_DEMO_MODEL", "CTXRT_TRACEBACK",
                           "CTXRT_LOG_LEVEL")}
    return {**base, **changes}


async def stored_count(store: Path) -> int:
    async with ctxrt.open_runtime(store, readonly=True) as runtime:
        with runtime.engine.reader() as txn:
            return runtime.engine.log_head(txn, "messages", runtime.engine.branch("main")).length


# -- what the demo reports ---------------------------------------------------------------------


async def test_the_demos_stored_messages_and_summaries_are_what_inspect_counts(tmp_path: Path) -> None:
    """Per reader and branch, the report's stored messages and summaries per level equal `inspect --json`'s."""
    store = tmp_path / "demo"
    with trio.fail_after(GUARD_S):
        report = await run_demo(store, messages=300, model=OfflineModel(), model_name="offline")
        code, out, err = await ctxrt_cli("inspect", str(store), "--json", env=environment())
    assert report.ok, report.problems
    assert code == 0, err
    branches = {branch["name"]: branch for branch in json.loads(out)["branches"]}
    for row in report.readers:
        branch = branches[row.branch]
        assert row.stored_messages == branch["slots"]["messages"]
        namespace = next(n for n in branch["namespaces"] if n["namespace"] == f"agents/{row.reader}")
        assert {str(level): count for level, count in row.summaries_per_level.items()} == \
            namespace["summaries_per_level"]
        assert 0 < row.raw_messages < row.stored_messages and 0 < row.summaries_used <= row.summaries
    # More messages are stored than turns written, and the report says by how many and why.
    assert report.written == report.messages + report.tool_cycles == branches["main"]["slots"]["messages"]
    assert report.tool_cycles > 0


async def test_the_demo_shows_one_turn_as_two_readers_requests_carry_it_and_a_summary(tmp_path: Path) -> None:
    """A2, A8: the demo ends with one message as ann's request carries it beside bob's (the line for ann
    in one, not the other) and a summary ann's request sends; the printed output shows the same."""
    with trio.fail_after(GUARD_S):
        report = await run_demo(tmp_path / "demo", messages=300, model=OfflineModel(), model_name="offline")
        code, out, err = await ctxrt_cli("demo", "--store", str(tmp_path / "printed"), "--messages", "300",
                                         env=environment(COLUMNS="240"))
    sample = report.sample
    assert sample is not None and (sample.reader, sample.other) == ("ann", "bob")
    private = [text for text in sample.as_reader if text.startswith("[for ann #")]
    assert len(private) == 1 and private[0] not in sample.as_other
    assert [text for text in sample.as_reader if text not in private] == sample.as_other  # the rest alike
    assert sample.summary_id is not None and sample.summary_text and sample.summary_covers
    assert code == 0, err
    assert "as ann's request carries it" in out and "as bob's request carries it" in out
    assert "a note only ann should see" in out and "a summary ann's request sends instead of older messages" in out
    assert "each of the" in out and "tool cycles is two messages, a call and its result" in out


async def test_the_demo_prints_an_inspect_command_that_runs_as_printed(tmp_path: Path) -> None:
    """With no `ctxrt` on PATH, the printed hint (store path quoted) runs as is from the same directory."""
    env = environment(PATH=os.defpath)
    with trio.fail_after(GUARD_S):
        code, out, err = await ctxrt_cli("demo", "--store", "my store", "--messages", "300", env=env, cwd=tmp_path)
        assert code == 0, err
        hint = next(line for line in out.splitlines() if "look inside with: " in line).split("look inside with: ")[1]
        assert hint.endswith("inspect 'my store'") and not hint.startswith("ctxrt ")
        command = shlex.split(hint)
        result = await trio.run_process(command, cwd=tmp_path, env=env, capture_stdout=True, capture_stderr=True,
                                        check=False)
    assert result.returncode == 0, result.stderr
    assert "agents/ann" in result.stdout.decode()
    assert "msgs stored" in out and "summaries stored" in out  # the table names what each column counts


def test_the_hint_says_ctxrt_when_this_installs_script_is_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hint is plain `ctxrt` only when PATH finds this interpreter's own ctxrt script."""
    script = Path(sys.executable).parent / "ctxrt"
    if not script.is_file():
        pytest.skip("ctxrt is not installed beside this interpreter")
    monkeypatch.setenv("PATH", str(script.parent))
    assert invocation() == "ctxrt"
    monkeypatch.setenv("PATH", os.defpath)
    assert invocation() in (str(script), relative(script))


# -- what the demo deletes ---------------------------------------------------------------------


async def test_the_demo_refuses_a_non_empty_directory_it_did_not_make_and_deletes_nothing(tmp_path: Path) -> None:
    """`demo --store DIR` on someone's directory is refused with exit 1; every file stays."""
    (tmp_path / "notes.txt").write_text("mine")
    code, out, err = await ctxrt_cli("demo", "--store", str(tmp_path), env=environment())
    assert (code, out) == (1, "")
    assert err.startswith(f"ctxrt: error: demo store {tmp_path} is not empty and is not a store the demo made")
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


async def test_the_demo_refuses_its_own_store_while_another_runtime_holds_it(tmp_path: Path) -> None:
    """A demo store a host has open is refused with StoreLockedError, and nothing in it is deleted."""
    store = tmp_path / "demo"
    with trio.fail_after(GUARD_S):
        await run_demo(store, messages=40, model=OfflineModel())
        before = sorted(p.name for p in store.iterdir())
        count = await stored_count(store)
        async with ctxrt.open_runtime(store) as runtime:
            manager = await runtime.open("host")
            await manager.add_message("user", "the host is still here")
            code, out, err = await ctxrt_cli("demo", "--store", str(store), "--messages", "40", env=environment())
        assert (code, out) == (1, "")
        assert err.startswith("ctxrt: error: store is locked by another writing runtime")
        assert "nothing was deleted" in err
        assert sorted(p.name for p in store.iterdir()) == before
        assert await stored_count(store) == count + 1  # the demo's messages and the host's line


async def test_a_second_run_replaces_the_store_the_first_made_but_not_a_file_it_did_not(tmp_path: Path) -> None:
    """The marker lets a rerun replace the demo's own store; a foreign file in it makes the rerun refuse."""
    store = tmp_path / "demo"
    with trio.fail_after(GUARD_S):
        first = await run_demo(store, messages=40, model=OfflineModel())
        assert (store / STORE_MARKER).is_file()
        second = await run_demo(store, messages=30, model=OfflineModel())
        assert await stored_count(store) == 31  # replaced, not appended to
        (store / "keep-me.txt").write_text("not the demo's")
        with pytest.raises(DemoStoreError, match="holds keep-me.txt, which the demo didn't make"):
            await run_demo(store, messages=30, model=OfflineModel())
    assert (store / "keep-me.txt").read_text() == "not the demo's" and await stored_count(store) == 31
    assert "too few to compress" in " ".join(first.problems + second.problems)


# -- when compression fails --------------------------------------------------------------------


async def test_the_demo_stops_before_writing_when_the_model_fails_a_first_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key set but refused (401): one small request fails, the error suggests running offline, no store is made."""
    async with open_messages_api_server(lambda body: ApiReply.error(401, "invalid x-api-key")) as server:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        monkeypatch.setenv("CTXRT_DEMO_MODEL", "test-model")
        with trio.fail_after(GUARD_S), pytest.raises(DemoModelError) as caught:
            await run_demo(tmp_path / "demo")  # the model the command would choose: AnthropicModel
    assert str(caught.value).startswith("compression model 'test-model' failed a first request, so the "
                                        "demo would compress nothing: model 'test-model': HTTP 401")
    assert str(caught.value).endswith("; unset ANTHROPIC_API_KEY to run the demo offline")
    assert not (tmp_path / "demo").exists() and len(server.requests) == 1


async def test_the_demo_fails_saying_so_when_every_compression_request_fails(tmp_path: Path) -> None:
    """The first request answers, every compression request fails: the report says so and the exit status is 1."""
    answered = []

    def script(body: dict) -> ApiReply:
        answered.append(body)
        return ApiReply.text("ready") if len(answered) == 1 else ApiReply.error(400, "prompt is too long")

    async with open_messages_api_server(script) as server:
        with trio.fail_after(GUARD_S):
            code, out, err = await ctxrt_cli(
                "demo", "--store", str(tmp_path / "demo"), "--messages", "300", "--json",
                env=environment(ANTHROPIC_API_KEY="test-key", ANTHROPIC_BASE_URL=server.base_url,
                                CTXRT_DEMO_MODEL="test-model"))
    assert code == 1, (out, err)
    report = json.loads(out)
    assert report["ok"] is False and report["private"] is True
    assert report["model_failures"] == report["model_requests"] == len(answered) - 1 > 0
    error = json.loads(err)  # one line: the runtime's own log stays off unless CTXRT_LOG_LEVEL asks
    assert error["error"] == "DemoFailed"
    assert error["message"].startswith("compression made no summaries for ann on main, bob on demo-fork")
    assert f"{report['model_failures']} of {report['model_requests']} compression requests" in error["message"]
    assert "prompt is too long" in error["message"]
