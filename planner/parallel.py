"""Independent searches of a serial loop run ahead in worker processes (``--jobs``).

An ``auto`` option's loop (the microbatch counts of ``--microbatches auto``) and a
sweep's rows are searches that do not depend on one another, but the loop decides in
order what to do with each: it skips a count whose lower bound the best so far beats,
and stops after a few slower counts in a row. :class:`Ahead` keeps the loop exactly as
it is, serial, and only answers ``get(i)`` sooner: up to ``jobs`` of the items from the
one the loop reads next onwards run at once, each in a forked child that sends back its
result (or its exception) pickled. An item the loop skips is killed, or never started
(``may_run``: a check against what the loop knows so far, so it says no only to items
the loop will certainly skip); a loop that stops early kills what runs ahead. Every item
the loop reads is the same computation as in the serial loop, in a child that inherits
the parent's state, so the result is the same bytes with any number of jobs; only the
time differs. Where workers cannot be forked (Windows, macOS: :func:`can_fork`) the
items run in the loop.

A child runs with one job itself (nested loops stay serial inside it) and never writes
to the terminal: the loop's parent says what is tried.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import selectors
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: worker processes ``--jobs auto`` uses at most (each holds a search's memory)
MAX_AUTO_JOBS = 16

_jobs = 1  # the command's --jobs; 1 inside a worker


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask where the system has one,
    and no more than a cgroup's CPU quota allows (a container given 2 of a host's 64
    CPUs: 16 workers there would share 2 CPUs, each slowed down by the others)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        n = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(n, quota)) if quota is not None else n


def _cgroup_quota(path: str = "/sys/fs/cgroup/cpu.max") -> int | None:
    """The CPUs a cgroup v2 quota (``cpu.max``: "quota period", or "max") allows,
    rounded up; None without one."""
    try:
        with open(path, encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else -(-int(quota) // int(period))
    except (OSError, ValueError):
        return None


def can_fork() -> bool:
    """Whether workers can be forked: not on Windows (no ``fork``), nor on macOS, where
    a forked child must not use the system frameworks its parent loaded (numpy's
    wheels there link Apple's Accelerate for BLAS)."""
    return hasattr(os, "fork") and sys.platform != "darwin"


def resolve_jobs(value: int | str) -> int:
    """``--jobs``: a count, or ``auto`` (the usable CPUs, at most :data:`MAX_AUTO_JOBS`);
    1 where workers cannot be forked (:func:`can_fork`)."""
    n = min(usable_cpus(), MAX_AUTO_JOBS) if value == "auto" else int(value)
    return n if can_fork() else 1


def set_jobs(n: int) -> None:
    """The number of searches a command's loops may run at once."""
    global _jobs
    _jobs = max(1, n)


def jobs() -> int:
    """The number of searches a loop may run at once (1 inside a worker)."""
    return _jobs


@contextlib.contextmanager
def running(n: int) -> Iterator[None]:
    """A command's block with ``n`` jobs (restored after: commands run in one process
    in the tests)."""
    before = _jobs
    set_jobs(n)
    try:
        yield
    finally:
        set_jobs(before)


class WorkerCrashed(RuntimeError):
    """A worker died without a result, or its result could not be sent back."""


class Ahead(Generic[T]):
    """The results of ``prepare(i)()`` for the items ``0 … n-1`` of a loop that reads
    them in order (:meth:`get`, or :meth:`skip` for one it does not need).

    ``prepare(i)`` runs in the parent, in item order (it may read the loop's files and
    say its notes), and returns the call that computes the item, which runs in a child;
    an exception ``prepare`` raises is the item's result. ``may_run(i)``, asked just
    before item ``i`` would start ahead of the loop, says whether the loop may still
    need it. ``shared(i)`` lists objects of the parent's that item ``i``'s result may
    hold (its network, cluster, kernel models): they come back as the parent's own
    objects, by reference, not as copies. Use as a context manager: leaving it kills
    what still runs."""

    def __init__(self, n: int, prepare: Callable[[int], Callable[[], T]],
                 may_run: Callable[[int], bool] | None = None, workers: int | None = None,
                 shared: Callable[[int], Sequence[Any]] | None = None) -> None:
        self._n = n
        self._prepare = prepare
        self._may_run = may_run or (lambda i: True)
        self._shared = shared or (lambda i: ())
        self._refs: dict[int, Sequence[Any]] = {}
        self._workers = jobs() if workers is None else workers
        self._calls: dict[int, Callable[[], T]] = {}
        self._failed: dict[int, BaseException] = {}  # prepare raised
        self._running: dict[int, tuple[int, int, bytearray]] = {}  # i → pid, fd, bytes
        self._done: dict[int, tuple[str, Any]] = {}
        self._next = 0  # the item the loop reads next
        self._ahead = 0  # the next item to consider starting ahead of the loop
        self._sel = selectors.DefaultSelector() if self._workers > 1 else None

    def __enter__(self) -> Ahead[T]:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the loop's side ----------------------------------------------------------------

    def get(self, i: int) -> T:
        """Item ``i``'s result (its exception raised), read in order."""
        assert i >= self._next, "items are read in order"
        self._next = i + 1
        self._ahead = max(self._ahead, i + 1)
        if self._sel is None:  # one job: the loop itself
            self._ready(i)
            if i in self._failed:
                raise self._failed.pop(i)
            return self._calls.pop(i)()
        if i not in self._running and i not in self._done:
            self._ready(i)
            if i in self._failed:
                raise self._failed.pop(i)
            self._make_room()
            if not self._start(i):  # no process to be had: the loop runs it
                return self._calls.pop(i)()
        self._fill()
        while i not in self._done:
            self._pump()
            self._fill()
        kind, value = self._done.pop(i)
        self._calls.pop(i, None)
        self._fill()
        if kind == "ok":
            return value  # type: ignore[no-any-return]
        if kind == "raise":
            raise value
        raise WorkerCrashed(value)

    def skip(self, i: int) -> None:
        """The loop does not need item ``i``: stop it if it runs ahead."""
        assert i >= self._next, "items are read in order"
        self._next = i + 1
        self._ahead = max(self._ahead, i + 1)
        self._kill(i)
        self._done.pop(i, None)
        self._calls.pop(i, None)
        self._failed.pop(i, None)

    def close(self) -> None:
        """Kill every child still running (the loop stopped early, or raised)."""
        for i in list(self._running):
            self._kill(i)
        if self._sel is not None:
            self._sel.close()
            self._sel = None

    # -- scheduling ---------------------------------------------------------------------

    def _ready(self, i: int) -> None:
        if i in self._calls or i in self._failed:
            return
        try:
            self._calls[i] = self._prepare(i)
        except Exception as exc:  # the item's result, raised when it is read
            self._failed[i] = exc

    def _fill(self) -> None:
        """Start items ahead of the loop, in order, while workers are free."""
        while len(self._running) < self._workers and self._ahead < self._n:
            j = self._ahead
            self._ahead += 1
            if j in self._running or j in self._done:
                continue
            self._ready(j)
            if j in self._failed or not self._may_run(j):
                continue
            if not self._start(j):  # no more processes: run with those there are
                self._ahead = j
                self._workers = max(1, len(self._running))
                return

    def _make_room(self) -> None:
        """The loop needs an item that is not running: with every worker busy, kill the
        one furthest ahead (it is started again if the loop reaches it)."""
        if len(self._running) >= self._workers:
            far = max(self._running)
            self._kill(far)
            self._ahead = min(self._ahead, far)

    def _start(self, i: int) -> bool:
        """Start item ``i`` in a child; False where the system gives no process (or
        pipe) now (the item is then the loop's to run)."""
        call = self._calls[i]  # kept: a child killed to make room may start again
        refs = self._refs[i] = self._shared(i)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            r, w = os.pipe()
        except OSError:
            return False
        # Ctrl-C waits until the child is registered, to be killed with the others: one
        # between the fork and the registration left the child running (a CI run saw
        # one outlive its command). Blocking SIGINT in this thread is not enough: the
        # kernel gives a process's signal to any thread that does not block it (a
        # timer's, a test runner's), and Python then raises KeyboardInterrupt in the
        # main thread at once; so the interrupt is held at Python's level too, and
        # raised once the child is on the list.
        with _interrupts_held() as mask:
            try:
                pid = os.fork()
            except OSError:  # EAGAIN, ENOMEM: too many processes, too little memory
                os.close(r)
                os.close(w)
                return False
            if pid == 0:  # the child: compute, send, and leave without cleaning up
                signal.signal(signal.SIGINT, signal.SIG_DFL)  # the parent handles Ctrl-C
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                os.close(r)
                _child(call, w, refs)
            os.close(w)
            self._running[i] = (pid, r, bytearray())
            assert self._sel is not None
            self._sel.register(r, selectors.EVENT_READ, i)
            return True

    def _pump(self) -> None:
        """Read what the children send; an item whose child closed its pipe is done."""
        assert self._sel is not None
        for key, _ in self._sel.select():
            i = key.data
            pid, fd, buf = self._running[i]
            chunk = os.read(fd, 1 << 20)
            if chunk:
                buf += chunk
                continue
            self._sel.unregister(fd)
            os.close(fd)
            del self._running[i]
            _, status = os.waitpid(pid, 0)
            refs = self._refs.pop(i, ())
            try:
                self._done[i] = _Unpickler(io.BytesIO(buf), refs).load()
            except Exception:
                self._done[i] = ("crash", f"a worker process ended (status {status}) "
                                          "without sending its result")

    def _kill(self, i: int) -> None:
        entry = self._running.pop(i, None)
        if entry is None:
            return
        pid, fd, _ = entry
        if self._sel is not None:
            self._sel.unregister(fd)
        os.close(fd)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


@contextlib.contextmanager
def _interrupts_held() -> Iterator[set[int | signal.Signals]]:
    """Hold Ctrl-C over the block: SIGINT blocked in this thread, and, in the main
    thread, Python's handler replaced by one that notes it; on leaving, the handler is
    restored and a noted interrupt is raised as it would have been (KeyboardInterrupt
    under Python's default handler). Yields the mask before, for a forked child to
    restore with the default handler (it never leaves the block: it exits in it)."""
    held: list[int] = []
    # signal.signal works in the main thread alone, and cannot put back a handler
    # installed outside Python (getsignal None)
    main = threading.current_thread() is threading.main_thread() \
        and signal.getsignal(signal.SIGINT) is not None
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    before = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum)) \
        if main else None
    try:
        yield mask
    finally:
        if main:
            signal.signal(signal.SIGINT, before)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if held:
            if callable(before):
                before(signal.SIGINT, None)
            elif before == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)


class _Pickler(pickle.Pickler):
    """Pickles the objects of ``refs`` (the parent has them) as their place in it."""

    def __init__(self, file: io.BytesIO, refs: Sequence[Any]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._ids = {id(obj): k for k, obj in enumerate(refs)}

    def persistent_id(self, obj: Any) -> int | None:
        return self._ids.get(id(obj))


class _Unpickler(pickle.Unpickler):
    """Reads what :class:`_Pickler` wrote, each reference as the object of ``refs``."""

    def __init__(self, file: io.BytesIO, refs: Sequence[Any]) -> None:
        super().__init__(file)
        self._refs = refs

    def persistent_load(self, pid: Any) -> Any:
        return self._refs[pid]


def _dumps(obj: Any, refs: Sequence[Any]) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, refs).dump(obj)
    return buf.getvalue()


def _child(call: Callable[[], Any], fd: int, refs: Sequence[Any] = ()) -> None:
    """A worker: run ``call`` with one job, send its result or exception pickled down
    ``fd`` (the objects of ``refs`` by reference), and exit at once (the parent's
    buffers, atexit hooks and threads are the parent's)."""
    code = 0
    try:
        set_jobs(1)
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # the parent handles Ctrl-C
        try:
            out: tuple[str, Any] = ("ok", call())
        except BaseException as exc:  # sent back, raised in the parent
            out = ("raise", exc)
        try:
            data = _dumps(out, refs)
        except Exception:
            data = pickle.dumps(("crash", "a worker's result could not be sent back:\n"
                                 + "".join(traceback.format_exception(*sys.exc_info()))))
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.close(fd)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


__all__ = ["MAX_AUTO_JOBS", "Ahead", "WorkerCrashed", "can_fork", "jobs", "resolve_jobs",
           "running", "set_jobs", "usable_cpus"]
