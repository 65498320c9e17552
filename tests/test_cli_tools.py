"""`ctxrt load-test` and `ctxrt bench`: where they write, what they leave, what they show (issue 14 items 4, 7).

Determinism: real subprocesses; TMPDIR points into pytest's temp dir, so what a command leaves
there can be listed; the tty case runs the command on a real pseudo-terminal. Load tests are
short (well under a second of load) and assert the checks and the files, never timings. The
bench tests run a stand-in bench/ package, since the real benchmarks take minutes.
"""

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
import trio

GUARD_S = 60
SMALL_LOAD = ["--duration", "0.3", "--namespaces", "2", "--managers", "4", "--readers", "2"]
FAKE_BENCH = '''\
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
(HERE / "results.md").write_text("# fresh results " + " ".join(sys.argv[1:]) + "\\n")
(HERE / "results-store.md").write_text("store figures\\n")
print("# fresh results")
'''


async def ctxrt_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
                    executable: list[str] | None = None) -> tuple[int, str, str]:
    with trio.fail_after(GUARD_S):
        result = await trio.run_process([*(executable or [sys.executable, "-m", "ctxrt"]), *args],
                                        capture_stdout=True, capture_stderr=True, check=False, env=env, cwd=cwd)
    return result.returncode, result.stdout.decode(), result.stderr.decode()


def with_tmpdir(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmp_path)}


# -- load-test ---------------------------------------------------------------------------------


async def test_load_test_removes_its_temporary_store_when_done(tmp_path: Path) -> None:
    """Without --store or --keep, the temporary store is gone afterwards, and the checks pass."""
    code, out, err = await ctxrt_cli("load-test", *SMALL_LOAD, "--json", env=with_tmpdir(tmp_path))
    assert (code, err) == (0, "")  # piped: no progress bar on stderr
    report = json.loads(out)
    assert report["ok"] is True and report["store_kept"] is False
    assert report["store"].startswith(str(tmp_path)) and not Path(report["store"]).exists()
    assert list(tmp_path.iterdir()) == []


async def test_load_test_keeps_its_temporary_store_with_keep_and_says_where(tmp_path: Path) -> None:
    """--keep leaves the store in place and the output names it."""
    code, out, err = await ctxrt_cli("load-test", *SMALL_LOAD, "--keep", env=with_tmpdir(tmp_path))
    assert code == 0, err
    kept = out.splitlines()[-1].removeprefix("store kept at ")
    assert kept.startswith(str(tmp_path)) and (Path(kept) / "data.mdb").is_file()
    # Refusals are explained in words, never printed as a Python dict.
    assert "{" not in out and ("no call was refused" in out or "refused with ReaderConflictError: the namespace" in out)


async def test_load_test_refuses_a_store_path_that_already_holds_something(tmp_path: Path) -> None:
    """--store on a non-empty directory is refused (its checks need a fresh store) and nothing there is touched."""
    (tmp_path / "notes.txt").write_text("mine")
    code, out, err = await ctxrt_cli("load-test", *SMALL_LOAD, "--store", str(tmp_path))
    assert (code, out) == (1, "")
    assert err == f"ctxrt: error: load-test store {tmp_path} is not new or empty; the load test needs a fresh store\n"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


async def test_load_test_shows_a_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    """On a tty, stderr carries a rich progress bar with the operations done (piped, it stays empty: above)."""

    def run_on_a_terminal() -> tuple[int, bytes, bytes]:
        leader, follower = pty.openpty()
        try:
            process = subprocess.Popen([sys.executable, "-m", "ctxrt", "load-test", *SMALL_LOAD, "--json"],
                                       stdout=subprocess.PIPE, stderr=follower, env=with_tmpdir(tmp_path))
            os.close(follower)
            screen = b""
            while True:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: the terminal's last writer is gone
                    break
                if not chunk:
                    break
                screen += chunk
            assert process.stdout is not None
            return process.wait(timeout=GUARD_S), process.stdout.read(), screen
        finally:
            os.close(leader)

    code, out, screen = await trio.to_thread.run_sync(run_on_a_terminal)
    assert code == 0 and json.loads(out)["ok"] is True  # stdout, not a tty, is untouched JSON
    assert b"load test" in screen and b"operations" in screen and b"\x1b[" in screen


# -- bench -------------------------------------------------------------------------------------


@pytest.fixture
def fake_checkout(tmp_path: Path) -> Path:
    """A bench/ package that, like the real one, writes results*.md next to its own code."""
    bench = tmp_path / "checkout" / "bench"
    bench.mkdir(parents=True)
    (bench / "__init__.py").write_text("")
    (bench / "__main__.py").write_text(FAKE_BENCH)
    (bench / "results.md").write_text("# committed results\n")
    return bench


async def test_bench_writes_its_results_to_output_and_leaves_the_committed_ones(tmp_path: Path,
                                                                                 fake_checkout: Path) -> None:
    """bench --output DIR gets results*.md; the checkout's committed results.md is unchanged."""
    output = tmp_path / "results"
    code, out, err = await ctxrt_cli("bench", "--quick", "--source", str(fake_checkout), "--output", str(output))
    assert code == 0, err
    assert (fake_checkout / "results.md").read_text() == "# committed results\n"
    assert not (fake_checkout / "results-store.md").exists()
    assert (output / "results.md").read_text() == "# fresh results --quick\n"
    assert (output / "results-store.md").is_file()
    assert out == "# fresh results\n"  # bench's own report, as it printed it
    assert err.rstrip().endswith(f"benchmark results written to {output}: results-store.md, results.md")


async def test_bench_without_output_writes_to_a_new_temporary_directory_and_says_where(
    tmp_path: Path, fake_checkout: Path
) -> None:
    """With no --output the results go to a fresh temporary directory, named in the --json answer."""
    code, out, err = await ctxrt_cli("bench", "--source", str(fake_checkout), "--json", env=with_tmpdir(tmp_path))
    assert code == 0, err
    answer = json.loads(out)  # bench's own markdown went to stderr, so stdout is only JSON
    assert answer["output"].startswith(str(tmp_path / "ctxrt-bench-")) and answer["exit_status"] == 0
    assert sorted(Path(f).name for f in answer["files"]) == ["results-store.md", "results.md"]
    assert (fake_checkout / "results.md").read_text() == "# committed results\n"


async def test_the_installed_ctxrt_command_finds_the_checkouts_benchmarks(tmp_path: Path) -> None:
    """The `ctxrt` script, run outside the checkout, finds the bench/ beside the ctxrt it runs (an editable install)."""
    script = Path(sys.executable).parent / "ctxrt"
    if not script.is_file():
        pytest.skip("needs the ctxrt script installed beside this interpreter (make test does that)")
    # Where the script's ctxrt comes from, seen from the same directory (not the test's own import).
    code, out, err = await ctxrt_cli("-c", "import ctxrt; print(ctxrt.__file__)", cwd=tmp_path,
                                     executable=[sys.executable])
    checkout = Path(out.strip()).resolve().parent.parent
    if code != 0 or not (checkout / "bench" / "__main__.py").is_file():
        pytest.skip("ctxrt is not installed in editable mode from a checkout")
    code, out, err = await ctxrt_cli("bench", "--dry-run", "--json", executable=[str(script)], cwd=tmp_path)
    assert code == 0, err
    plan = json.loads(out)
    assert plan["sources"] == str(checkout / "bench") and plan["command"][1:] == ["-m", "bench"]


async def test_bench_names_where_the_benchmarks_live_when_it_cant_find_them(tmp_path: Path) -> None:
    """A --source without a bench package is refused in one line, exit 1."""
    code, out, err = await ctxrt_cli("bench", "--source", str(tmp_path / "nothing"))
    assert (code, out, err) == (1, "", f"ctxrt: error: no benchmarks at {tmp_path / 'nothing'}\n")
