"""A real SIGINT at every line of ThreadCommitter / CommitThread's loop-side methods, reached the Nth time,
while a host appends alone (and, MANY: with several tasks). Checks: KeyboardInterrupt, no thread left,
no open transaction, stored == acknowledged (+ at most the interrupted one, last), closes (no hang)."""
import ast, os, signal, sys, threading, time
from pathlib import Path
import psycopg, trio, ctxrt
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from support import at_line
from ctxrt.testing import temporary_cluster

COMMITTER = str(Path(ctxrt.__file__).parent / "store" / "committer.py")
WRITER = str(Path(ctxrt.__file__).parent / "store" / "writer.py")
MANY = int(os.environ.get("MANY", "1"))
NTH = int(os.environ.get("NTH", "5"))

def lines(path, classes, methods=None):
    tree = ast.parse(open(path).read())
    out = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in classes:
            for f in node.body:
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and (methods is None or f.name in methods):
                    body_lines = set()
                    for n in ast.walk(f):
                        if hasattr(n, "lineno") and isinstance(n, ast.stmt) and n is not f:
                            body_lines.add(n.lineno)
                    out += [(f.name, l) for l in sorted(body_lines)]
        if isinstance(node, ast.AsyncFunctionDef) and node.name in classes:
            out += [(node.name, n.lineno) for n in ast.walk(node) if isinstance(n, ast.stmt) and n is not node]
    return out

def one(url, path, line):
    sent, acked = [], []
    reached = 0
    def reach():
        nonlocal reached
        reached += 1
        if reached == NTH:
            os.kill(os.getpid(), signal.SIGINT)
    async def host():
        async with ctxrt.open_runtime(url, durability="sync") as rt:
            manager = await rt.open("ann", isolate=True)
            async def task(k):
                for n in range(8):
                    text = f"{k} {n}"; sent.append(text)
                    await manager.add_message("user", text)
                    acked.append(text)
            async with trio.open_nursery() as nursery:
                for k in range(MANY):
                    nursery.start_soon(task, k)
    sys.settrace(at_line(path, line, reach))
    outcome = "no KI"
    start = time.monotonic()
    try:
        trio.run(host)
    except KeyboardInterrupt:
        outcome = "KI"
    except BaseException as exc:
        outcome = f"{type(exc).__name__}: {str(exc)[:150]}"
    finally:
        sys.settrace(None)
    took = time.monotonic() - start
    problems = []
    if reached >= NTH and outcome != "KI":
        problems.append(outcome)
    threads = [t.name for t in threading.enumerate() if t.name.startswith("ctxrt")]
    if threads: problems.append(f"threads {threads}")
    txns = []
    if url.startswith("postgresql"):
      with psycopg.connect(url, autocommit=True) as admin:
        txns = admin.execute("SELECT pid, state FROM pg_stat_activity WHERE datname = current_database()"
                             " AND pid <> pg_backend_pid() AND xact_start IS NOT NULL").fetchall()
    if txns: problems.append(f"open txns {txns}")
    async def stored():
        async with ctxrt.open_runtime(url, readonly=True) as rt:
            m = await rt.open("ann", isolate=True)
            return [x.content[0].text for x in await m.get_all_messages()]
    try:
        texts = trio.run(stored)
    except ctxrt.UnknownStateError:
        texts = []
    extra = [t for t in texts if t not in acked]
    per_task = all([t for t in texts if t.split()[0] == str(k)] == [t for t in sent if t.split()[0] == str(k)][:len([t for t in texts if t.split()[0] == str(k)])] for k in range(MANY))
    if not set(acked) <= set(texts) or not per_task or len(set(texts)) != len(texts) or len(extra) > MANY or any(t not in sent for t in extra):
        problems.append(f"stored {texts} acked {acked}")
    if took > 20: problems.append(f"took {took:.1f}s")
    return reached, outcome, problems

LMDB_FILE = str(Path(ctxrt.__file__).parent / "store" / "committer_lmdb.py")
if os.environ.get("STORE") == "lmdb":
    import tempfile
    from ctxrt.store import committer_lmdb
    lm = ast.parse(open(LMDB_FILE).read())
    names = {n.name for n in lm.body if isinstance(n, (ast.ClassDef, ast.AsyncFunctionDef, ast.FunctionDef))}
    targets = [(LMDB_FILE, l) for _, l in lines(LMDB_FILE, names)]
    for n in lm.body:
        if isinstance(n, ast.FunctionDef):
            targets += [(LMDB_FILE, x.lineno) for x in ast.walk(n) if isinstance(x, ast.stmt) and x is not n]
    targets += [(WRITER, l) for _, l in lines(WRITER, {"CommitThread", "WriterThread"})]
    counts = {"tried": 0, "reached": 0, "bad": 0}
    for i, (path, line) in enumerate(sorted(set(targets))):
        url = tempfile.mkdtemp(prefix="attpg-lmdb-")
        reached, outcome, problems = one(url, path, line)
        counts["tried"] += 1; counts["reached"] += reached >= NTH; counts["bad"] += bool(problems)
        if problems:
            print(f"BAD {Path(path).name}:{line} reached {reached}: {problems}", flush=True)
    print(counts)
    sys.exit()
targets = lines(COMMITTER, {"ThreadCommitter", "GiveTurns", "await_commit"}) + lines(WRITER, {"CommitThread"}, {"hand_over", "wait", "landed", "offer_turn", "give_turn", "_run", "_drop_stale_tokens"})
only = os.environ.get("ONLY")
with temporary_cluster() as cluster:
    counts = {"tried": 0, "reached": 0, "bad": 0}
    for i, (fn, line) in enumerate(targets):
        path = COMMITTER if (fn in {"ThreadCommitter", "GiveTurns", "await_commit"} or i < len(lines(COMMITTER, {"ThreadCommitter", "GiveTurns", "await_commit"}))) else WRITER
        if only and f"{fn}:{line}" != only: continue
        url = cluster.create_database(f"s{i}")
        reached, outcome, problems = one(url, path, line)
        counts["tried"] += 1; counts["reached"] += reached >= NTH; counts["bad"] += bool(problems)
        if problems:
            print(f"BAD {Path(path).name}:{line} ({fn}) reached {reached}: {problems}", flush=True)
    print(counts)
