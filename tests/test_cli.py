"""The main job and the tools around it: the demo, the read-only CLI, the load test.

Determinism: real LMDB in temp dirs, the real clock under ``trio.fail_after`` guards; the CLI
runs in real subprocesses (`python -m ctxrt ...`) against a store this process is writing.
"""

import json
import sys
from pathlib import Path

import pytest
import trio

import ctxrt
from ctxrt.demo import run_demo
from ctxrt.loadtest import refusal_lines, run_load_test
from ctxrt import OfflineModel

GUARD_S = 120


async def test_the_demo_runs_offline_and_no_reader_sees_another_readers_lines(tmp_path: Path) -> None:
    """The demo (shortened) compresses in the background, forks, derives, and passes its privacy check."""
    with trio.fail_after(GUARD_S):
        report = await run_demo(tmp_path / "demo", messages=300, model=OfflineModel(), model_name="offline")
    assert report.private, report.leaks
    assert report.model_requests > 0
    assert {r.reader for r in report.readers} == {"ann", "bob", "cy"}
    assert all(r.summaries > 0 for r in report.readers)
    assert all(r.audience_blocks_seen > 0 for r in report.readers)
    assert {r.branch for r in report.readers} >= {"main", "demo-fork", "demo-derived"}


async def ctxrt_cli(*args: str) -> tuple[int, str, str]:
    result = await trio.run_process(
        [sys.executable, "-m", "ctxrt", *args], capture_stdout=True, capture_stderr=True, check=False
    )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def test_every_read_only_command_works_while_another_runtime_writes(tmp_path: Path) -> None:
    """Read-only commands open with readonly=True and answer while a host holds the writer's lock."""
    store = tmp_path / "live"
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store, model=ctxrt.testing.ScriptedModel(lambda r: "a memory " * 10)) as rt:
            ann = await rt.open("agents/ann", view_reader="ann", strategy=ctxrt.Autobiographical(
                "m", target_chunk_tokens=100, recent_window_tokens=100, l1_holdback_chunks=0))
            for i in range(30):
                await ann.add_message("user", [{"type": "text", "text": f"line {i} " + "word " * 30},
                                               {"type": "text", "text": f"secret {i}", "audience": ["ann"]}])
            await ann.wait_ready()
            stop = trio.Event()

            async def keep_writing() -> None:
                while not stop.is_set():
                    await ann.add_message("user", "still talking")
                    await trio.sleep(0.01)  # pacing, not a wait: unpaced, the writes flood the store and the strategy

            async with trio.open_nursery() as nursery:
                nursery.start_soon(keep_writing)
                code, out, err = await ctxrt_cli("inspect", str(store), "--json")
                assert code == 0, err
                inspected = json.loads(out)
                main = next(b for b in inspected["branches"] if b["name"] == "main")
                assert main["slots"]["messages"] >= 30
                namespace = next(n for n in main["namespaces"] if n["namespace"] == "agents/ann")
                assert namespace["reader"] == "ann" and namespace["narrowing_floor"] > 0
                assert namespace["summaries_per_level"]["1"] >= 1

                code, out, err = await ctxrt_cli("messages", str(store), "--tail", "5", "--json")
                assert code == 0, err
                assert len(json.loads(out)["messages"]) == 5

                code, out, err = await ctxrt_cli("compile", str(store), "--namespace", "agents/ann", "--budget",
                                                 "20000", "--json")
                assert code == 0, err
                compiled = json.loads(out)
                assert compiled["reader"] == "ann"
                assert "audience" not in out
                assert any("secret" in json.dumps(m) for m in compiled["request"]["messages"])

                code, out, err = await ctxrt_cli("compile", str(store), "--namespace", "agents/ann", "--reader",
                                                 "bob", "--budget", "20000")
                assert (code, out) == (1, "") and err.startswith("ctxrt: error: ") and "records reader 'ann'" in err

                code, out, err = await ctxrt_cli("summaries", str(store), "--namespace", "agents/ann", "--json")
                assert code == 0, err
                assert json.loads(out) and all(s["level"] >= 1 for s in json.loads(out))
                stop.set()
            before = rt.engine.last_sequence
            await ann.add_message("user", "the writer still owns the store")
            assert rt.engine.last_sequence == before + 1


async def test_a_read_only_command_on_a_missing_store_fails_clearly(tmp_path: Path) -> None:
    """A read-only command on a path with no store says so in one line on stderr and exits 1."""
    code, out, err = await ctxrt_cli("inspect", str(tmp_path / "nothing"))
    assert (code, out) == (1, "")
    assert err == f"ctxrt: error: no ctxrt store at {tmp_path / 'nothing'} (no data.mdb)\n"


HOSTILE = "clear \x1b[2J\x1b]0;owned\x07 back\rover \u202eesrever"


async def test_stored_text_with_terminal_controls_prints_as_escapes_never_as_controls(tmp_path: Path) -> None:
    """W18: a message holding an escape sequence, a bell, a carriage return and a bidi override
    prints through `messages` and `compile` with each shown as its escape; none reaches the
    terminal, and `--json` keeps the text exact."""
    store = tmp_path / "hostile"
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store) as rt:
            m = await rt.open("agents/ann", view_reader="ann")
            await m.add_message("user", HOSTILE)
        outputs = []
        for command in (["messages", str(store), "--tail", "1"],
                        ["compile", str(store), "--namespace", "agents/ann", "--budget", "8000"]):
            code, out, err = await ctxrt_cli(*command)
            assert code == 0, err
            outputs.append(out)
        code, as_json, err = await ctxrt_cli("messages", str(store), "--tail", "1", "--json")
    for shown in outputs:
        assert not any(control in shown for control in "\x1b\x07\r\u202e"), repr(shown)
        assert "clear \\x1b[2J\\x1b]0;owned\\x07 back\\rover \\u202eesrever" in shown
    assert code == 0, err
    assert json.loads(as_json)["messages"][0]["content"][0]["text"] == HOSTILE


@pytest.mark.soak
async def test_the_bounded_load_test_loses_nothing_claims_once_and_leaks_nothing(tmp_path: Path) -> None:
    """50 namespaces, 200 managers, 5 readers: no lost message, one claim per namespace, no leak, no deadlock."""
    import os

    duration = 60.0 if os.environ.get("CTXRT_SOAK") == "1" else 8.0
    with trio.fail_after(max(GUARD_S, duration * 4)):
        report = await run_load_test(tmp_path / "load", namespaces=50, managers=200, readers=5, duration_s=duration,
                                     guard_s=duration * 3)
    assert not report.deadlocked
    assert report.messages_acknowledged == report.messages_stored > 0
    assert not report.claim_conflicts
    assert len(report.claims) == 50 and all(report.claims.values())
    assert report.actors_left == 0
    assert report.operations["compile"] > 0 and report.operations["open"] >= 50
    assert set(report.refusals) <= {"open: ReaderConflictError"}
    assert all("unexpected" not in line for line in refusal_lines(report.refusals))


async def test_compile_dry_runs_with_the_strategy_config_the_namespace_runs(tmp_path: Path) -> None:
    """Issue 14 (5): the namespace records the config it runs (and set_strategy's), so `ctxrt compile`
    sends exactly the request the resident would get, not an approximation of its windows."""
    store = tmp_path / "live"
    config = ctxrt.Autobiographical("m", head_window_tokens=120, recent_window_tokens=300, target_chunk_tokens=200)
    budget = ctxrt.Budget(max_tokens=3_000, reserve_for_response=1_000)
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store, model=ctxrt.testing.ScriptedModel(lambda r: "a memory " * 10)) as rt:
            m = await rt.open("agents/ann", view_reader="ann", strategy=ctxrt.WindowedPassthrough(0.25))
            await m.set_strategy(config)
            for i in range(40):
                await m.add_message("user" if i % 2 else "Claude", f"line {i} " + "words " * 30)
            await m.wait_ready()
            expected = (await m.compile(budget, dry_run=True)).to_anthropic(assistant="Claude")
            code, out, err = await ctxrt_cli("compile", str(store), "--namespace", "agents/ann", "--budget", "3000",
                                             "--reserve", "1000", "--json")
    assert code == 0, err
    assert json.loads(out)["request"]["messages"] == expected["messages"]


async def test_verify_reports_a_sound_store_and_a_damaged_one_without_crashing(tmp_path: Path) -> None:
    """K7: `ctxrt verify` walks every record in a child process: exit 0 for a sound store, 1 with the
    damage named for a truncated data file, as text and as JSON."""
    store = tmp_path / "store"
    with trio.fail_after(GUARD_S):
        async with ctxrt.open_runtime(store) as rt:
            m = await rt.open("a")
            for i in range(200):
                await m.add_message("user", f"line {i} " + "words " * 20)
        code, out, err = await ctxrt_cli("verify", str(store))
        assert (code, err) == (0, "") and ": sound (" in out
        data = store / "data.mdb"
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
        code, out, err = await ctxrt_cli("verify", str(store), "--json")
    assert code == 1, err
    report = json.loads(out)
    assert report["status"] == "damaged" and report["damage"] and report["exit_code"] == 1
