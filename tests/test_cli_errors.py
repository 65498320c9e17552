"""The CLI's conventions: errors, exit statuses, option checks, help and piped output (issue 14 item 4).

Determinism: every command runs as a real subprocess (`python -m ctxrt ...`) against a real store
built in a temp dir by this process; assertions are on exit status, stdout and stderr, never time.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import ctxrt

LONG_LINE = "a line well past eighty columns, " * 6


async def ctxrt_cli(*args: str) -> tuple[int, str, str]:
    result = await trio.run_process([sys.executable, "-m", "ctxrt", *args], capture_stdout=True,
                                    capture_stderr=True, check=False)
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def ctxrt_cli_each(*commands: list[str]) -> list[tuple[int, str, str]]:
    """Run several commands at once (each is a fresh interpreter: about 0.4 s of imports)."""
    results: list[tuple[int, str, str]] = [(-1, "", "")] * len(commands)

    async def run(index: int) -> None:
        results[index] = await ctxrt_cli(*commands[index])

    async with trio.open_nursery() as nursery:
        for index in range(len(commands)):
            nursery.start_soon(run, index)
    return results


@pytest.fixture
async def store(tmp_path: Path) -> Path:
    """A small store: five messages in the shared slot, namespace agents/ann recording reader ann."""
    path = tmp_path / "store"
    async with ctxrt.open_runtime(path) as runtime:
        ann = await runtime.open("agents/ann", view_reader="ann")
        for index in range(4):
            await ann.add_message("user", f"message {index}")
        await ann.add_message("user", LONG_LINE)
    return path


def assert_one_error_line(code: int, out: str, err: str, *, status: int, starts: str) -> None:
    assert (code, out) == (status, "")
    assert err.startswith(starts) and err.count("\n") == 1, err
    assert "Traceback" not in err


# -- damaged and missing stores ----------------------------------------------------------------


async def test_a_garbage_data_mdb_is_one_error_line_on_stderr_and_exit_1(tmp_path: Path) -> None:
    """inspect, messages, compile and summaries on a data.mdb that isn't LMDB: one line naming the store, exit 1."""
    (tmp_path / "data.mdb").write_bytes(b"not an lmdb file " * 1000)
    store = str(tmp_path)
    results = await ctxrt_cli_each(["inspect", store], ["messages", store], ["compile", store, "--namespace", "x"],
                                   ["summaries", store, "--namespace", "x"])
    for code, out, err in results:
        # The wording is the store's (lmdb's today; StoreCorruptError's once the store checks its
        # files): the CLI's part is one line naming the store, whatever raised.
        assert_one_error_line(code, out, err, status=1, starts="ctxrt: error: ")
        assert store in err


async def test_under_json_an_error_is_a_json_object_on_stderr_and_stdout_stays_empty(tmp_path: Path) -> None:
    """--json: the error is {"error": type, "message": text} on one stderr line; stdout holds nothing."""
    (tmp_path / "data.mdb").write_bytes(b"\0" * 9000)
    code, out, err = await ctxrt_cli("inspect", str(tmp_path), "--json")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1
    error = json.loads(err)
    assert set(error) == {"error", "message"} and error["error"]  # e.g. lmdb.InvalidError, StoreCorruptError
    assert str(tmp_path) in error["message"] and not error["message"].startswith("ctxrt: error")


# -- option values and combinations (usage errors: exit 2) ------------------------------------


async def test_compile_refuses_budgets_it_cant_use_naming_the_options(store: Path) -> None:
    """--budget -5, --reserve -1 (as a JSON usage error under --json) and a budget with no room: exit 2."""
    compile_ = ["compile", str(store), "--namespace", "agents/ann"]
    negative, reserve, no_room = await ctxrt_cli_each([*compile_, "--budget", "-5"], [*compile_, "--reserve", "-1",
                                                      "--json"], [*compile_, "--budget", "3000"])
    code, out, err = negative
    assert (code, out) == (2, "")
    assert err.startswith("usage: ctxrt compile")
    assert err.endswith("ctxrt compile: error: argument --budget: must be 1 or more, got -5\n")
    code, out, err = reserve
    assert (code, out) == (2, "")
    assert json.loads(err) == {"error": "UsageError", "message": "argument --reserve: must be 0 or more, got -1"}
    code, out, err = no_room  # under the default --reserve 4000 it would compile nothing
    assert (code, out) == (2, "")
    assert "--budget 3000 leaves no room after --reserve 4000" in err


async def test_messages_refuses_a_negative_tail_and_tail_with_offset_or_limit(store: Path) -> None:
    """--tail -3 (which printed "messages 7..6") and --tail with --offset or --limit (one was ignored): exit 2."""
    messages = ["messages", str(store), "--tail"]
    negative, *combined = await ctxrt_cli_each([*messages, "-3"], [*messages, "2", "--offset", "1"],
                                               [*messages, "2", "--limit", "2"])
    code, out, err = negative
    assert (code, out) == (2, "")
    assert err.endswith("error: argument --tail: must be 0 or more, got -3\n")
    for code, out, err in combined:
        assert (code, out) == (2, "")
        assert "--tail shows the last N messages: give it alone" in err


# -- names the store doesn't have (failures: exit 1) -------------------------------------------


async def test_a_namespace_the_store_lacks_is_refused_naming_the_ones_it_has(store: Path) -> None:
    """compile and summaries on an unknown namespace fail instead of answering as if it existed."""
    for code, out, err in await ctxrt_cli_each(["compile", str(store), "--namespace", "agents/nosuch"],
                                               ["summaries", str(store), "--namespace", "agents/nosuch"]):
        assert_one_error_line(code, out, err, status=1, starts="ctxrt: error: no namespace 'agents/nosuch'")
        assert err.rstrip().endswith("its namespaces: agents/ann")


async def test_messages_refuses_an_unknown_slot_or_branch_naming_what_the_store_has(store: Path) -> None:
    """--slot nosuch names the store's slots; --branch nosuch names its branches."""
    (code, out, err), branch = await ctxrt_cli_each(["messages", str(store), "--slot", "nosuch"],
                                                    ["messages", str(store), "--branch", "nosuch", "--json"])
    assert_one_error_line(code, out, err, status=1, starts="ctxrt: error: no slot 'nosuch'")
    assert err.rstrip().endswith("its slots: messages")
    code, out, err = branch
    assert (code, out) == (1, "")
    assert json.loads(err)["error"] == "BranchNotFoundError" and "its branches: main" in err


# -- output ------------------------------------------------------------------------------------


async def test_piped_output_is_not_wrapped_at_80_columns(store: Path) -> None:
    """Off a tty, each message is one line however long (rich would wrap at 80 columns)."""
    code, out, err = await ctxrt_cli("messages", str(store), "--tail", "2")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "messages on main: messages 3..4 (positions counting from 0, as --offset counts; ids under --json) of 5"
    assert len(lines) == 3 and LONG_LINE.strip() in lines[2] and len(lines[2]) > 180


async def test_messages_numbers_its_lines_as_its_header_does(store: Path) -> None:
    """The header's range and each line's number are one numbering, the position --offset takes."""
    (code, out, err), (_, as_json, _) = await ctxrt_cli_each(["messages", str(store), "--offset", "1", "--limit", "2"],
                                                             ["messages", str(store), "--offset", "1", "--limit", "2",
                                                              "--json"])
    assert code == 0, err
    header, *lines = out.splitlines()
    assert "messages 1..2 " in header
    assert [line.split()[0] for line in lines] == ["1", "2"]
    assert [m["id"] for m in json.loads(as_json)["messages"]] != ["1", "2"]  # ids are another numbering


async def test_output_piped_into_a_reader_that_stops_early_exits_0_quietly(store: Path) -> None:
    """`ctxrt inspect STORE | head -c 1`: the closed pipe is no error (rich alone would exit 1)."""

    def read_one_byte_then_close() -> tuple[int, bytes]:
        process = subprocess.Popen([sys.executable, "-m", "ctxrt", "inspect", str(store)], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, bufsize=0)
        assert process.stdout is not None and process.stderr is not None
        process.stdout.read(1)
        process.stdout.close()
        return process.wait(timeout=60), process.stderr.read()

    assert await trio.to_thread.run_sync(read_one_byte_then_close) == (0, b"")


async def test_version_prints_the_installed_version() -> None:
    """--version prints "ctxrt <version>" on stdout and exits 0."""
    from importlib.metadata import version

    code, out, _ = await ctxrt_cli("--version")
    assert (code, out) == (0, f"ctxrt {version('ctxrt')}\n")


async def test_help_shows_each_options_default_and_no_docstring_markup() -> None:
    """The top-level help has no ``markup`` and documents exit statuses and JSON errors; options show defaults."""
    top, messages, compile_ = await ctxrt_cli_each(["--help"], ["messages", "--help"], ["compile", "--help"])
    code, out, _ = top
    assert code == 0 and "``" not in out
    assert "exit status: 0 success, 1 failure" in out and '{"error": "<type>", "message": "<text>"}' in out
    code, out, _ = messages
    flat = " ".join(out.split())
    assert code == 0 and "(default: main)" in flat and "(default: 50)" in flat and "(default: 0)" in flat
    code, out, _ = compile_
    flat = " ".join(out.split())
    assert code == 0 and "(default: 100000)" in flat and "(default: 4000)" in flat


async def test_compile_counts_turns_and_their_tokens(store: Path) -> None:
    """The header counts the turns it prints, and their tokens add up to the header's; --json
    carries the same figures beside the request (it held the request alone before)."""
    code, out, err = await ctxrt_cli("compile", str(store), "--namespace", "agents/ann", "--budget", "10000")
    assert code == 0, err
    header, *lines = out.splitlines()
    assert header.startswith("dry-run compile of agents/ann on main for reader 'ann': 1 turn, ")
    tokens = [int(line.split("(")[1].split(" tokens)")[0].replace(",", "")) for line in lines]
    assert len(lines) == 1 and lines[0].startswith("user (")
    assert f"1 turn, {sum(tokens):,} tokens of the budget's 6,000 " in header
    code, out, err = await ctxrt_cli("compile", str(store), "--namespace", "agents/ann", "--budget", "10000", "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert (shown["tokens"], shown["turn_tokens"], shown["usable"]) == (sum(tokens), tokens, 6000)
    assert len(shown["request"]["messages"]) == len(tokens)


STORE_COMMANDS = ("inspect", "messages", "compile", "summaries", "serve", "verify")


async def test_every_command_that_takes_a_store_says_a_url_works_too() -> None:
    """A postgresql:// URL opens wherever a STORE is taken, and each command's help says so."""
    for name, (code, out, _) in zip(STORE_COMMANDS, await ctxrt_cli_each(*([name, "--help"] for name in STORE_COMMANDS)),
                                    strict=True):
        assert code == 0 and "a directory, or a postgresql:// URL" in " ".join(out.split()), name


async def test_a_stray_argument_is_a_usage_error_under_the_subcommands_usage(tmp_path: Path) -> None:
    """From every subcommand: exit 2, that subcommand's usage, the stray argument named, nothing run."""
    from ctxrt.cli import SUBCOMMANDS

    required = {"inspect": [str(tmp_path)], "messages": [str(tmp_path)], "serve": [str(tmp_path)],
                "verify": [str(tmp_path)], "compile": [str(tmp_path), "--namespace", "ns"],
                "summaries": [str(tmp_path), "--namespace", "ns"]}
    names = [subcommand.name for subcommand in SUBCOMMANDS]
    results = await ctxrt_cli_each(*([name, *required.get(name, []), "stray"] for name in names))
    for name, (code, out, err) in zip(names, results, strict=True):
        assert (code, out) == (2, ""), (name, err)
        assert err.startswith(f"usage: ctxrt {name} "), err
        assert err.endswith(f"ctxrt {name}: error: unrecognized arguments: stray\n"), err
    assert list(tmp_path.iterdir()) == []  # no command ran


async def test_a_port_past_65535_is_a_usage_error() -> None:
    """serve --port 99999 (an OverflowError from bind, exit 1, before): exit 2 under serve's usage."""
    code, out, err = await ctxrt_cli("serve", "nowhere", "--port", "99999")
    assert (code, out) == (2, "")
    assert err.startswith("usage: ctxrt serve ")
    assert err.endswith("error: argument --port: must be 65535 or less, got 99999\n")


async def test_the_demos_help_counts_turns_as_its_output_does() -> None:
    """--messages N writes N turns (the table's "N turns written"); its help says turns too."""
    code, out, _ = await ctxrt_cli("demo", "--help")
    flat = " ".join(out.split())
    assert code == 0 and "--messages N turns the residents write" in flat


@pytest.fixture(autouse=True)
def _no_traceback_override(monkeypatch: pytest.MonkeyPatch) -> None:
    # The subprocesses inherit the environment: a developer's CTXRT_TRACEBACK=1 would change them.
    monkeypatch.delenv("CTXRT_TRACEBACK", raising=False)
    assert "CTXRT_TRACEBACK" not in os.environ


async def test_a_database_url_without_psycopg_is_one_line_naming_the_extra() -> None:
    """M7, K4: every command that takes a store, given a postgresql:// URL where psycopg isn't
    installed, says in one line which extra to install; no traceback, exit status 1."""
    block = "import sys, runpy; sys.modules['psycopg'] = None; sys.argv[0] = 'ctxrt'; runpy.run_module('ctxrt', run_name='__main__')"
    url = "postgresql://someone@nowhere/db"
    commands = [["verify", url], ["inspect", url], ["messages", url], ["summaries", url, "--namespace", "ns"],
                ["compile", url, "--namespace", "ns"], ["load-test", "--store", url]]

    async def run(args: list[str]) -> tuple[int, str, str]:
        result = await trio.run_process([sys.executable, "-c", block, *args], capture_stdout=True,
                                        capture_stderr=True, check=False)
        return result.returncode, result.stdout.decode(), result.stderr.decode()

    outcomes: dict[str, tuple[int, str, str]] = {}

    async def each(args: list[str]) -> None:
        outcomes[args[0]] = await run(args)

    async with trio.open_nursery() as nursery:
        for args in commands:
            nursery.start_soon(each, args)
    for name, (code, out, err) in outcomes.items():
        assert_one_error_line(code, out, err, status=1, starts="ctxrt: error: ImportError: a postgresql:// store needs psycopg")
        assert "pip install 'ctxrt[postgres]'" in err, name


async def test_a_ctrl_c_after_the_command_has_done_its_work_changes_nothing(tmp_path: Path) -> None:
    """cli.md's exit statuses (from a host-style attack): a SIGINT that lands while Python shuts down,
    after the command printed its answer, neither kills the process by its signal with nothing said
    nor changes the status (before: 10 of 23 `verify` runs died by SIGINT at that moment)."""
    late_interrupt = (
        "import atexit, os, signal, sys, time\n"
        "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.2)))\n"
        "sys.argv = ['ctxrt', '--help']\n"
        "from ctxrt.cli import run\n"
        "run()\n"
    )
    result = await trio.run_process([sys.executable, "-c", late_interrupt], capture_stdout=True,
                                    capture_stderr=True, check=False)
    assert result.returncode == 0, result.stderr.decode()
    assert b"usage: ctxrt" in result.stdout and result.stderr == b""


async def test_serve_on_a_taken_port_names_the_port_and_how_to_get_a_free_one(store: Path) -> None:
    """serve on a port something already listens on: exit 1 with one line naming the address and
    --port 0 (it said only '[Errno 98] Address already in use' before)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = await ctxrt_cli("serve", str(store), "--port", str(port))
    assert_one_error_line(code, out, err, status=1, starts="ctxrt: error:")
    assert f"127.0.0.1:{port} is taken" in err and "--port 0" in err
