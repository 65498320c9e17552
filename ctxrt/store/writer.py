"""The commit thread the loop hands commits to (``CommitThread``), and LMDB's (``WriterThread``): it
begins and ends every top-level write transaction of a durable LMDB store.

A commit thread runs one commit at a time, handed over by the loop (``hand_over``), and makes
``ready`` readable when it ended; the loop waits for it through trio's I/O wait or, idle, by
blocking for it (``wait``: store/committer.py's ``GiveTurns``). PostgreSQL's committer runs a whole
batch on one (its round trips, with psycopg's Python between them); LMDB's writer thread only
begins and commits transactions the loop fills.

Why a thread of its own: a durable commit (LMDB's own: write the pages, ``fdatasync``, write the
meta page through its ``O_DSYNC`` descriptor) would stop the trio thread for both flushes. An
LMDB write transaction belongs to the thread that began it (the writer mutex, a robust pthread
mutex, is taken at begin and released at commit or abort, by that thread only), so this thread
begins each transaction and commits it, and the trio thread fills it in between (puts and nested
transactions don't care which thread calls them, one at a time). The thread commits with the GIL
released, exactly as LMDB commits anywhere, so the order LMDB relies on for a power loss (data,
flush, meta, flush) is kept; only the thread that waits for it changed.

The GIL convoy. A thread waking into a busy interpreter may wait a long time for the GIL: trio
drops and retakes it at every ``epoll`` pass, which restarts CPython's switch-request timer, so
the waiter almost never gets it (measured: seconds, with one busy task). So the thread never
needs the GIL at a moment nobody gives it: its Python runs in short *turns* (taking a job up to
the C call; after the commit, beginning the next transaction and saying so), each ending with a
token on ``_turns``. The trio thread hands a turn over by blocking on that token (the GIL is
free while it blocks): at once for the short jobs (``begin``, ``abort``, ``end``, ``stop``), and
for a commit only when the loop is busy and the thread wants the GIL (``offer_turn``: the job not
taken yet, or LMDB's last transaction id moved past the one before the commit, which LMDB sets
only after the meta page is written), for a bounded time; a loop that sleeps in ``epoll`` leaves
the GIL free anyway. PostgreSQL's batch runs Python between its round trips, whose ends the loop
can't see: a busy loop offers it a turn before it took the job, and at each pass once it has been
out as long as a commit takes (a moving average); the loop leaves it the GIL when it idles (it
blocks for the commit) or sleeps in ``epoll``. Standard library only: no trio here
(store/committer.py and committer_lmdb.py do the waiting).
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from collections.abc import Callable

import lmdb

# A commit out this long is offered a turn every STALLED_S, PROBE_S long (offer_turn): one that
# failed moves no transaction id, and its callers should hear so without waiting for an idle loop.
STALLED_S = 0.1
PROBE_S = 0.0002
# The longest the loop waits for a turn the thread certainly wants: its Python takes microseconds,
# but on a host short of CPU the OS may not run the thread at once, and the loop mustn't wait for it.
TURN_S = 0.0002
_AVERAGED = 0.2  # each commit's weight in the moving average of a commit's time


class CommitThread:
    """A thread that runs the commits the loop hands it, one at a time (see the module doc).

    Every method is called from the loop's thread, one at a time.
    """

    # Whether the loop hands a commit's first turn over at once (``hand_over``): when the commit's
    # own Python is short (LMDB's). PostgreSQL's batch runs Python up to its first round trip, and
    # the loop blocked for the GIL meanwhile (measured: a lone append 0.04 ms slower with it); the
    # loop's next pass gives the turn (``offer_turn``) or waits for the commit with the GIL free.
    first_turn_at_once = False

    def __init__(self, name: str = "ctxrt-store-committer") -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._turns: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._error: BaseException | None = None  # a job's failure, raised or returned in the loop
        # Turns handed to the thread (the loop counts them) and turns it ended (the thread counts
        # them, before each token): the tokens only wake the loop. A KeyboardInterrupt that
        # asyncio's handler raises as a wait takes a token loses no count (it once left a turn
        # counted owed for good, and the loop blocked for it forever).
        self._turns_handed = 0
        self._turns_ended = 0
        self._handed_at = self._offered_at = 0.0
        self._expected_s = math.inf  # how long the commit out may take before it wants its turn
        self._told_to_end = False  # what it held ended for good, and it ends at the next job (or never ran)
        # The moving average of a commit's time (one that failed isn't counted), timed and kept by
        # the thread; unknown (infinite) until one landed.
        self.commit_s = math.inf
        self._ready_read, self._ready_write = os.pipe()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- the loop's jobs ---------------------------------------------------------------------

    def stop(self) -> None:
        """End what the thread holds (``_end_txn``) and the thread, and close ``ready``. Idempotent,
        and whole when called again after an interrupt cut it short (asyncio's second Ctrl-C raises
        anywhere).

        Never ``Thread.is_alive``: a ``KeyboardInterrupt`` raised inside it (or inside ``join``)
        marks a thread that still runs as stopped (CPython 3.11's bpo-45274 handling), and a stop
        that then skipped the thread would leave it holding its transaction (closing LMDB's
        environment under it hangs) or a batch out. The thread was started if it has an ident."""
        if self._ready_read < 0:
            return
        if self._thread.ident is None:  # never started
            self._told_to_end = True
        if not self._told_to_end:
            # An interrupt inside an earlier wait left turns owed: the thread still ends them, so
            # wait them out rather than refuse to stop; none ending for a second means one was
            # counted but never handed over (the interrupt came in between).
            while self._due:
                ended = self._turns_ended
                self.give_turn(1.0)
                if self._turns_ended == ended:
                    self._turns_handed = ended
            self._run(self._end_txn)
            self._told_to_end = True
        if self._thread.ident is not None:
            self._jobs.put(None)  # again after an interrupt: the thread ends at the first
            self._thread.join()
        ready_read, ready_write = self._ready_read, self._ready_write
        self._ready_read = self._ready_write = -1  # first: a stop cut short here closes nothing twice
        os.close(ready_read)
        os.close(ready_write)

    def hand_over(self, work: Callable[[], None]) -> None:
        """Hand ``work`` (the commit) over to the thread; returns at once.

        The thread runs it, then ``_committed`` (the next transaction, say), then makes ``ready``
        readable. Meanwhile the loop offers turns (``offer_turn``); once ``ready`` is readable it
        calls ``landed``.
        """
        assert self._due == 0
        self._handed_at = self._offered_at = time.monotonic()
        self._expected_s = self.commit_s
        self._drop_stale_tokens()
        self._turns_handed += 2  # taking the job up to the commit; its end, and saying so
        self._jobs.put(lambda: self._commit(work))
        if self.first_turn_at_once:
            # The thread wakes straight into a free GIL (waiting for the loop's next pass, it
            # would wake, wait for the GIL, and wake again), and is in the commit after.
            self.give_turn(TURN_S)

    def wait(self, timeout: float) -> bool:
        """Block (the GIL released) up to ``timeout`` for the commit out to end; whether it ended
        (then ``landed`` says how, without waiting)."""
        if not self._due:
            return True
        deadline = time.monotonic() + timeout
        while self._due:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.give_turn(left)
        return True

    @property
    def ready(self) -> int:
        """A descriptor that turns readable when a commit handed over has ended."""
        return self._ready_read

    def landed(self) -> BaseException | None:
        """After ``ready`` turned readable: what the commit raised, or None."""
        os.read(self._ready_read, 1)
        while self._due:  # its last turn ends right after ``ready`` is written
            self.give_turn()
        error, self._error = self._error, None
        return error

    def offer_turn(self) -> None:
        """The loop is busy (it won't sleep in ``epoll`` now): if the thread waits for the GIL to go
        on with the commit out, give it its turn (block, the GIL released, until the turn ends).

        Cheap when it doesn't: the thread's state is known without it. It waits for the GIL when it
        hasn't taken the job yet, or when ``_commit_ended`` says so; the loop then waits up to
        ``TURN_S`` (a thread the OS hasn't run yet gets the next busy pass's offer; a commit that
        didn't end in that turn is offered the next later, ``_declined``). Otherwise a
        commit out for ``STALLED_S`` gets a turn offered, for at most ``PROBE_S``, every
        ``STALLED_S``: one still waiting (for the disk, the server) doesn't take it, and the loop goes on.
        """
        due = self._turns_handed - self._turns_ended  # ``_due``, read once: this runs at every busy pass
        if due == 0:
            return
        if due == 2:
            self.give_turn(TURN_S)
        elif self._commit_ended():
            ended = self._turns_ended
            self.give_turn(TURN_S)
            if self._turns_ended == ended:
                self._declined()
        elif time.monotonic() - self._offered_at > STALLED_S:
            self.give_turn(PROBE_S)
            self._offered_at = time.monotonic()

    def _commit_ended(self) -> bool:
        """Whether the commit out has likely ended its wait (then it wants the GIL): it has been out
        as long as a commit takes (``_expected_s``). Without it, a PostgreSQL batch whose answer came
        while the loop was busy waited for the GIL by luck or for the stalled commit's probe (every
        ``STALLED_S``)."""
        return time.monotonic() - self._handed_at >= self._expected_s

    def _declined(self) -> None:
        """A turn offered once the commit was due didn't end it: it is slower than a commit takes
        (a server that stalls, say). Offer the next when it has been out half as long again, or
        ``STALLED_S`` later: offered at every busy pass, a stalled server's batch held a busy loop
        to 1/40th of its passes (TURN_S and the wake-up after it, each pass; K16)."""
        out = time.monotonic() - self._handed_at
        self._expected_s = out + min(out / 2, STALLED_S)

    @property
    def _due(self) -> int:
        """Turns handed to the thread that it hasn't ended yet."""
        return self._turns_handed - self._turns_ended

    def give_turn(self, timeout: float | None = None) -> None:
        """Block (the GIL released) until the thread's current turn ends, or for ``timeout``."""
        ended = self._turns_ended
        if self._turns_handed == ended:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._turns_ended == ended:  # a token left by a wait cut short wakes it once more
            try:
                self._turns.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return

    # -- the loop's side of a short job ---------------------------------------------------------

    def _run(self, job: Callable[[], None]) -> None:
        assert self._due == 0, "a commit is still out"
        self._drop_stale_tokens()
        self._turns_handed += 1
        self._jobs.put(lambda: self._short(job))
        self.give_turn()
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _drop_stale_tokens(self) -> None:
        """No turn is out: a token still queued is one a wait didn't take (it had returned)."""
        while not self._turns.empty():  # only the loop takes tokens: no raise of Empty per commit
            self._turns.get_nowait()

    # -- the thread ---------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()

    def _short(self, job: Callable[[], None]) -> None:
        try:
            job()
        except BaseException as exc:
            self._error = exc
        finally:
            self._turns_ended += 1
            self._turns.put(None)

    def _end_txn(self) -> None:
        """On the thread, at ``stop``: end what it holds between commits (nothing here)."""

    def _committed(self) -> None:
        """On the thread, after a commit landed, before ``ready``: nothing here."""

    def _commit(self, work: Callable[[], None]) -> None:
        try:
            self._turns_ended += 1
            self._turns.put(None)  # the first turn ends: the GIL is free from here to the commit's end
            started = time.perf_counter()
            work()
            took = time.perf_counter() - started
            self.commit_s = took if self.commit_s == math.inf else self.commit_s + _AVERAGED * (took - self.commit_s)
            self._committed()
        except BaseException as exc:
            self._error = exc
        os.write(self._ready_write, b"\0")
        self._turns_ended += 1
        self._turns.put(None)  # last: the loop this wakes finds the GIL free (the thread is parking)


class WriterThread(CommitThread):
    """The thread that owns ``env``'s write transactions; the loop fills them (see the module doc).

    Between jobs the thread holds a transaction begun for the next batch (``begin`` returns it), so
    a batch waits for no thread.
    """

    first_turn_at_once = True  # the commit is LMDB's C call: the thread needs the GIL only to reach it

    def __init__(self, env: lmdb.Environment) -> None:
        super().__init__("ctxrt-store-writer")
        self._env = env
        self._txn: lmdb.Transaction[bytes] | None = None
        self._last_txnid = 0  # LMDB's, when the commit out was handed over

    # -- the transaction source Engine.prepare takes --------------------------------------------

    def begin(self) -> lmdb.Transaction[bytes]:
        """The write transaction for the next batch (begun now if the thread holds none)."""
        if self._txn is None:
            self._run(self._begin_txn)
        assert self._txn is not None
        return self._txn

    def abort(self, txn: lmdb.Transaction[bytes]) -> None:
        """Abort the batch's transaction, and begin the next one, on the thread."""
        assert txn is self._txn
        self._run(self._restart_txn)

    def end(self) -> None:
        """Abort the transaction held (if any) and begin none: the map may be resized meanwhile."""
        self._run(self._end_txn)

    def commit(self) -> None:
        """Hand the filled transaction over to be committed (``hand_over``); returns at once. The
        thread commits it (both flushes) and begins the next if the commit landed; a commit that
        failed LMDB aborted, and the thread holds no transaction then."""
        assert self._due == 0 and self._txn is not None
        txn, self._txn = self._txn, None
        self._last_txnid = txn.id() - 1  # LMDB's last, as it stood at begin: a write transaction takes the next id
        self.hand_over(txn.commit)

    def _commit_ended(self) -> bool:
        # LMDB sets its last transaction id only after the meta page is written.
        return self._env.info()["last_txnid"] != self._last_txnid

    def _begin_txn(self) -> None:
        self._txn = self._env.begin(write=True)

    def _end_txn(self) -> None:
        if self._txn is not None:
            txn, self._txn = self._txn, None
            txn.abort()

    def _restart_txn(self) -> None:
        self._end_txn()
        self._begin_txn()

    def _committed(self) -> None:
        try:
            self._txn = self._env.begin(write=True)
        except BaseException:  # the commit landed; the next ``begin`` tries again and says why
            self._txn = None
