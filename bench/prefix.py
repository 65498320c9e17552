"""Prefix benchmark: prompt-cache continuity across turns (P9), current design against the previous.

    python -m bench.prefix [--quick]

A multi-resident run per strategy (``bench/prefix_probe.py``): three residents on one slot, one
compiling per turn in turn order, then adding its message (varied sizes, 10 to 600 estimated
tokens); 2,000 turns (300 with ``--quick``).

- WindowedPassthrough (``re_anchor_fraction=0.5``) under a 24,000-token budget, which the run
  overflows now and then (a re-anchor each ~80 messages).
- Autobiographical (chunks of 1,500 tokens, a 3,000-token head window, a 6,000-token recent window,
  summaries of ~250 tokens from a ``ScriptedModel``; ``wait_ready()`` between turns compresses what
  is due) under a 150,000-token budget.

For each request (``to_anthropic(assistant=<resident>)``) the probe takes, from the body alone, the
share of its estimated tokens lying in its longest prefix byte-identical to the same resident's
previous request up to one of that request's ``cache_control`` positions: what Anthropic's prompt
cache, written by the previous request, can serve. ``cache_control`` itself is left out of the
comparison (the tail's marker moves on each turn). Tokens are estimated as characters of each
block's JSON over 4. A resident's first request is not counted. The figure is the mean share over
the run's requests.

The previous design is commit 796a154 (``git archive`` into a temporary directory, as
``bench/actors.py`` does), run in its own subprocess with ``PYTHONPATH`` at that tree; the current
one likewise at this checkout. The same probe, so the same measuring code, runs on both. If the
history isn't here, the previous design's column says why. Targets: Windowed >= 0.90,
Autobiographical >= 0.70. A last row per strategy gives the current design's mean
``CompileResult.stable_prefix_tokens`` over its own estimate of the compile (no target: it compares
with the manager's previous compile, the previous resident's, with the compile's own estimator).
Results are printed and written to ``bench/results-prefix.md``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import harness
from .actors import PREVIOUS, previous_tree
from .harness import TABLE_HEAD, measured

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PROBE = HERE / "prefix_probe.py"
RESULTS_PATH = HERE / "results-prefix.md"
STRATEGIES = ("windowed", "autobiographical")
NAMES = {"windowed": "WindowedPassthrough", "autobiographical": "Autobiographical"}
TARGETS = {"windowed": 0.90, "autobiographical": 0.70}
LABEL = f"previous design ({PREVIOUS})"


def _start(package_root: Path, directory: Path, strategy: str, turns: int) -> tuple[subprocess.Popen[str], Path]:
    directory.mkdir(parents=True)
    log = directory / "stderr.log"
    env = dict(os.environ, PYTHONPATH=str(package_root), PYTHONDONTWRITEBYTECODE="1")
    process = subprocess.Popen(
        [sys.executable, str(PROBE), str(directory / "store"), strategy, str(turns)],
        stdout=subprocess.PIPE, stderr=log.open("wb"), env=env, cwd=str(directory), text=True,
    )
    return process, log


def _finish(process: subprocess.Popen[str], log: Path, timeout: float) -> dict[str, Any] | str:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return f"the probe ran past {timeout:.0f} s"
    if process.returncode != 0 or not out.strip():
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
        return f"the probe failed (exit {process.returncode}): {' '.join(tail)[:300]}"
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def run(quick: bool = False) -> list[dict[str, Any]]:
    turns = 300 if quick else 2_000
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ctxrt-prefix-", dir=os.environ.get("CTXRT_BENCH_DIR") or None,
                                     ignore_cleanup_errors=True) as tmp:
        directory = Path(tmp)
        previous = previous_tree(directory)
        roots: dict[str, Path] = {"current": ROOT}
        if isinstance(previous, Path):
            roots["previous"] = previous
        running = {(design, strategy): _start(root, directory / f"{design}-{strategy}", strategy, turns)
                   for design, root in roots.items() for strategy in STRATEGIES}
        results = {key: _finish(*value, timeout=600) for key, value in running.items()}
    for strategy in STRATEGIES:
        mine = results[("current", strategy)]
        if isinstance(mine, str):
            raise RuntimeError(f"{strategy}, current design: {mine}")
        theirs = results.get(("previous", strategy), previous if isinstance(previous, str) else "?")
        share = statistics.mean(mine["shares"])
        fields: dict[str, Any] = {}
        if isinstance(theirs, str):
            fields["comparison"] = None
            fields["comparison_note"] = f"skipped: {theirs}"
        else:
            fields["comparison"] = statistics.mean(theirs["shares"])
        rows.append({
            "measure": f"{NAMES[strategy]}: mean share of a request's tokens in a prefix cached by the previous request",
            "unit": "", "ctxrt": share, **fields, "comparison_label": LABEL,
            "ratio": None, "target": TARGETS[strategy], "op": ">=", "passed": share >= TARGETS[strategy],
            "requests": len(mine["shares"]), "turns": turns, "probe_s": mine["seconds"],
            "zero_share_requests": sum(1 for s in mine["shares"] if s == 0),
            "comparison_zero_share_requests": None if isinstance(theirs, str)
            else sum(1 for s in theirs["shares"] if s == 0),
        })
        if mine["stable"]:
            rows.append({
                "measure": f"{NAMES[strategy]}: mean stable_prefix_tokens / compile's estimated tokens",
                "unit": "", "ctxrt": statistics.mean(mine["stable"]), "comparison": None,
                "comparison_label": LABEL, "ratio": None, "target": None, "op": None, "passed": None,
                "requests": len(mine["stable"]), "turns": turns,
            })
    for each in rows:
        each["quick"] = quick
        each["wall_s"] = time.perf_counter() - started
    return rows


def to_markdown(rows: list[dict[str, Any]]) -> str:
    quick = bool(rows and rows[0].get("quick"))
    turns = rows[0].get("turns") if rows else "?"
    lines = ["## Prefix", "", measured("prefix", quick, f"{turns:,} turns per strategy" if isinstance(turns, int)
                                       else "?"), "",
             "Mean, over the run's requests, of the share of a request's tokens (chars/4 of each block's JSON) "
             "in its longest prefix byte-identical (cache_control aside) to the same resident's previous "
             "request up to one of that request's cache_control positions. Three residents on one slot, "
             "one compiling per turn.", "", *TABLE_HEAD]
    for each in rows:
        comparison = each.get("comparison")
        if each.get("comparison_note"):
            theirs = str(each["comparison_note"])
        elif isinstance(comparison, float):
            theirs = f"{comparison:.3f} ({each['comparison_label']})"
        else:
            theirs = "–"
        target = "–" if each.get("target") is None else f"{each['op']} {each['target']:.2f}"
        passed = {True: "pass", False: "FAIL", None: "–"}[each.get("passed")]
        lines.append(f"| {each['measure']} | {each['ctxrt']:.3f} | {theirs} | – | {target} | {passed} |")
    zero = [f"{each['measure'].split(':', 1)[0]} {each['zero_share_requests']} of {each['requests']}"
            + (f" (previous: {each['comparison_zero_share_requests']})"
               if each.get("comparison_zero_share_requests") is not None else "")
            for each in rows if "zero_share_requests" in each]
    lines += ["", "Requests with nothing cached (a first request after a re-anchor, a summary merge "
              "before the latest seam...): " + "; ".join(zero) + "."]
    return "\n".join(lines) + "\n"


main = harness.entry("prefix", __doc__, run, to_markdown, RESULTS_PATH,
                     quick_help="300 turns per strategy instead of 2,000")

if __name__ == "__main__":
    sys.exit(main())
