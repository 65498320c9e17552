"""Attack 5: the disk fills under the store (L6, K-store full).

Needs root (it mounts a 2 MB tmpfs at MOUNT; skipped otherwise). On it: a filler file to free
later, and the store, opened with durability "sync" (or "os") and either the default map (the map reaches
past the disk: the commit's write or flush fails with ENOSPC) or the smallest map (the map must
grow and the disk can't hold it). Writers append messages of 30 KB, one lone writer or several
at once, until each was refused REFUSALS times. Expected: every refused caller gets
StoreFullError (nothing else, nobody hangs), what was refused is not in the store, everything
acknowledged is; reads go on; once the filler is deleted, appends succeed again; after a
reopen the same holds and ``ctxrt verify`` says sound.

    sudo python attack/a5_full.py
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import ctxrt  # noqa: E402

MOUNT = Path("/var/tmp/att35-tmpfs")
REFUSALS = 3
SIZE = 30_000


def mount() -> bool:
    MOUNT.mkdir(exist_ok=True)
    if os.path.ismount(MOUNT):
        subprocess.run(["umount", str(MOUNT)], check=False)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(MOUNT)]).returncode == 0


async def scenario(map_size: int, writers: int, durability: str) -> list[str]:
    problems: list[str] = []
    store = MOUNT / "store"
    filler = MOUNT / "filler"
    filler.write_bytes(os.urandom(600_000))
    acked: dict[str, str] = {}
    refused: set[str] = set()
    errors: Counter[str] = Counter()
    async with ctxrt.open_runtime(store, durability=durability, map_size=map_size) as rt:
        manager = await rt.open("a", isolate=True)

        async def writer(task: int, phase: int, refusals: int) -> None:
            n = 0
            while refusals:
                text = common.payload(phase, "a", task, n, SIZE)
                try:
                    with trio.fail_after(30):
                        acked[text] = await manager.add_message("user", text)
                except ctxrt.StoreFullError:
                    refused.add(text)
                    refusals -= 1
                except trio.TooSlowError:
                    problems.append(f"an append hung 30 s (task {task})")
                    return
                except Exception as exc:  # noqa: BLE001 - reported
                    errors[type(exc).__name__] += 1
                    refused.add(text)
                    refusals -= 1
                n += 1

        async with trio.open_nursery() as nursery:
            for task in range(writers):
                nursery.start_soon(writer, task, 0, REFUSALS)
        if not refused:
            problems.append("never refused")
        if errors:
            problems.append(f"refused with other errors: {dict(errors)}")
        problems += await check(manager, acked, refused, "full")
        # Space comes back: writes resume.
        filler.unlink()
        resumed = 0
        for n in range(5):
            text = common.payload(1, "a", 0, n, SIZE)
            try:
                acked[text] = await manager.add_message("user", text)
                resumed += 1
            except ctxrt.StoreFullError as exc:
                problems.append(f"after freeing 600 KB: still refused: {exc}")
                break
        problems += await check(manager, acked, refused, "freed")
        await manager.aclose()
    async with ctxrt.open_runtime(store) as rt:
        async with await rt.open("a", isolate=True) as manager:
            problems += await check(manager, acked, refused, "reopened")
    code, detail = common.verify_cli(store)
    if code != 0:
        problems.append(f"verify exit {code}: {detail}")
    print(f"  map {map_size}, writers {writers}: acked {len(acked)}, refused {len(refused)}, resumed {resumed}, "
          f"verify: {detail}", flush=True)
    return problems


async def check(manager, acked: dict[str, str], refused: set[str], when: str) -> list[str]:
    problems = []
    stored: dict[str, list[str]] = {}
    for message in await manager.get_all_messages():
        stored.setdefault(common.text_of(message), []).append(message.id)
    for text, mid in acked.items():
        if stored.get(text) != [mid]:
            problems.append(f"{when}: acked {text[:20]} ({mid}) stored as {stored.get(text)}")
    for text in refused & set(stored):
        problems.append(f"{when}: refused {text[:20]} is stored as {stored[text]}")
    return problems


def main() -> None:
    if os.geteuid() != 0 or not mount():
        print("RESULT a5: skipped (needs root to mount a tmpfs)")
        return
    logging.basicConfig(level=logging.ERROR)  # the store's warnings (each refusal, each growth) stay out
    failures = rounds = 0
    try:
        for map_size, writers, durability in itertools.product((1 << 36, 1 << 16), (1, 12), ("sync", "os")):
            for entry in MOUNT.iterdir():
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            rounds += 1
            started = time.monotonic()
            problems = trio.run(scenario, map_size, writers, durability)
            print(f"map {map_size} writers {writers} durability {durability}: {'ok' if not problems else 'FAIL'} "
                  f"({time.monotonic() - started:.1f}s)", flush=True)
            for p in problems[:20]:
                print("   ", p, flush=True)
            failures += bool(problems)
    finally:
        subprocess.run(["umount", str(MOUNT)], check=False)
    print(f"RESULT a5: {rounds} scenarios, {failures} failed", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
