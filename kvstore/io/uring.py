"""io_uring backend: many requests per system call, one ring thread.

Callers queue a request (a list on a deque, under the submit lock) and get a
``Future``.  One ring thread owns the ring: it moves every queued request into
the submission ring (at most ``queue_depth`` in flight), submits them with one
``io_uring_enter``, reaps the completions, completes the futures (their
callbacks run there) and, with nothing to do, sleeps in ``poll`` on the ring
fd and an eventfd.  A caller writes the eventfd only while the ring thread
sleeps, so requests resubmitted from completion callbacks (the bench's
pattern) or queued while it works cost no system call of their own, and a
burst of reads from one caller (a chunk read's runs) goes down in one batch.
All ring access on one thread also means the kernel runs the completion
task work on the thread that waits for it, and no lock guards the ring.
Short reads and writes are continued until done, as the posix backend does.

Binding: ``liburing`` from PyPI.  Two of its limits, measured, set the shape:

- its blocking waits (``io_uring_wait_cqe``, ``io_uring_submit_and_wait``)
  hold the GIL: a thread waiting in ``io_uring_wait_cqe`` on an idle ring
  stopped the whole process (a million-iteration loop on the main thread had
  not finished after 10 s).  So nothing here blocks inside liburing: the ring
  thread waits in ``select.poll`` (which releases the GIL) and only submits
  and peeks through liburing;
- ``io_uring_prep_read``/``prep_write`` take a ``bytearray`` only (mmap
  memory, memoryviews and numpy arrays are refused), while ``Iovec`` takes
  any contiguous buffer, so requests go as READV/WRITEV of one ``iovec``.

On a 2-vCPU VM a 32 KiB O_DIRECT random read costs ~13 us of process CPU
this way, against ~45 us on the posix thread pool.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import select
import tempfile
import threading
import weakref
from collections import deque

from .base import FileHandle, aligned_nbytes
from .future import Future
from .posix import FdBackend

log = logging.getLogger(__name__)

PROBE_TIMEOUT_MS = 2000  # the probe's read of a page-cache file takes microseconds
# Completions handled between two submits: requests resubmitted by the first
# callbacks reach the device while the rest of the batch is still completed.
RESUBMIT_EVERY = 4
BACKLOG_RETRY_MS = 1  # submission refused for now (EAGAIN, EBUSY): try again this soon
_READ, _WRITE = 0, 1
# io_uring_submit errors that mean "reap first, then submit again"
_RETRY_SUBMIT = (errno.EINTR, errno.EAGAIN, errno.EBUSY)


@functools.cache
def unavailable_reason() -> str | None:
    """None when io_uring works here (a ring was set up and did a tiny read), else why not.

    Probed once per process: liburing importable, ``io_uring_setup``
    permitted (``kernel.io_uring_disabled`` and container seccomp profiles
    refuse it), and a READV through the ring returning the bytes written.
    """
    try:
        import liburing  # noqa: F401
    except Exception as exc:  # ImportError, or no wheel for this platform
        return f"liburing is not importable ({exc.__class__.__name__}: {exc})"
    try:
        return _probe_read()
    except OSError as exc:
        return _setup_error(exc)


def _setup_error(exc: OSError) -> str:
    if exc.errno == errno.ENOSYS:
        return "the kernel has no io_uring (io_uring_setup: ENOSYS)"
    if exc.errno == errno.EPERM:
        return "io_uring is not permitted here (io_uring_setup: EPERM; sysctl kernel.io_uring_disabled or a seccomp profile)"
    return f"io_uring failed ({exc.__class__.__name__}: {exc})"


def _probe_read() -> str | None:
    import liburing as L

    ring = L.Ring()
    L.io_uring_queue_init(2, ring)
    try:
        with tempfile.TemporaryFile() as f:
            f.write(b"kvstore io_uring probe")
            f.flush()
            buf = bytearray(22)
            iov = L.Iovec([buf])
            sqe = L.io_uring_get_sqe(ring)
            L.io_uring_prep_readv(sqe, f.fileno(), iov, 0)
            sqe.user_data = 1
            L.io_uring_submit(ring)
            poller = select.poll()
            poller.register(ring.ring_fd, select.POLLIN)
            if not poller.poll(PROBE_TIMEOUT_MS):
                return f"a probe read through io_uring did not complete in {PROBE_TIMEOUT_MS} ms"
            cqe = L.Cqe()
            L.io_uring_peek_cqe(ring, cqe)
            n = cqe[0].res
            L.io_uring_cqe_seen(ring, cqe[0])
            if bytes(buf[:n]) != b"kvstore io_uring probe":
                return f"a probe read through io_uring returned {bytes(buf[:n])!r}"
    finally:
        L.io_uring_queue_exit(ring)
    return None


class UringFuture(Future):
    """A request's future, completed (and its callbacks run) on the ring thread."""

    __slots__ = ()


class _Ring:
    """What the ring thread and the submitters share; never the backend itself,
    so a backend dropped without ``shutdown`` is collected and lets its thread go."""

    def __init__(self, depth: int, lock: threading.Lock):
        import liburing

        self.L = liburing
        self.ring = liburing.Ring()
        liburing.io_uring_queue_init(depth, self.ring)
        self.cqe = liburing.Cqe()
        self.wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.depth = depth
        self.lock = lock  # the backend's submit lock
        self.queue: deque = deque()  # [future, op, fd, view, offset, nbytes, done, iovec]
        self.pending: dict[int, list] = {}  # tag (user_data) -> request, while the kernel has it
        self.sleeping = False  # the ring thread is (about to be) in poll: wake it
        self.stopping = False
        self.closed = False
        self.error: BaseException | None = None  # the ring thread failed: refuse new requests
        self.enters = 0  # io_uring_enter calls that submitted
        self.submitted = 0  # requests (and continuations) they carried
        self.peak_in_flight = 0  # most requests the ring held at once


def _stop(st: _Ring) -> None:
    """Ask the ring thread to finish the queued requests and exit."""
    with st.lock:
        if st.closed or st.stopping:
            return
        st.stopping = True
        os.eventfd_write(st.wake_fd, 1)


def _ring_loop(st: _Ring) -> None:
    """The ring thread: submit what is queued, reap, complete; sleep when idle."""
    try:
        _serve(st)
    except BaseException as exc:  # a bug or a broken ring: fail every request rather than hang it
        # (requests still in the kernel are cancelled when the ring is torn down)
        log.exception("io_uring ring thread failed")
        _fail_all(st, exc)
    finally:
        with st.lock:
            st.closed = True
            os.close(st.wake_fd)
            st.L.io_uring_queue_exit(st.ring)


def _serve(st: _Ring) -> None:
    L, ring, cqe, queue = st.L, st.ring, st.cqe, st.queue
    get_sqe, prep_readv, prep_writev, Iovec = L.io_uring_get_sqe, L.io_uring_prep_readv, L.io_uring_prep_writev, L.Iovec
    sq_ready, submit, CqeIter, cq_advance = L.io_uring_sq_ready, L.io_uring_submit, L.CqeIter, L.io_uring_cq_advance
    pending = st.pending
    free_tags = list(range(st.depth))
    poller = select.poll()
    poller.register(ring.ring_fd, select.POLLIN)
    poller.register(st.wake_fd, select.POLLIN)
    wake_fd = st.wake_fd

    def prep(tag: int, req: list) -> None:
        done = req[6]
        view = req[3] if not done else req[3][done:]
        req[7] = iov = Iovec([view])  # kept until completion
        sqe = get_sqe(ring)  # never None: no more than depth requests are in the ring
        (prep_readv if req[1] == _READ else prep_writev)(sqe, req[2], iov, req[4] + done)
        sqe.user_data = tag

    def push() -> bool:
        """Move queued requests into the ring and submit them; True when some stayed behind."""
        while queue and free_tags:
            req = queue.popleft()
            tag = free_tags.pop()
            pending[tag] = req
            prep(tag, req)
        if len(pending) > st.peak_in_flight:
            st.peak_in_flight = len(pending)
        if not sq_ready(ring):
            return False
        try:
            st.submitted += submit(ring)  # one io_uring_enter for the whole batch
            st.enters += 1
        except OSError as exc:
            if exc.errno not in _RETRY_SUBMIT:
                raise
        return sq_ready(ring) > 0  # the kernel took part of the batch: submit the rest soon

    while True:
        backlog = push()
        completions = []
        for _ in CqeIter(ring, cqe):
            entry = cqe[0]
            try:
                completions.append((entry.user_data, entry.res, None))
            except OSError as exc:  # res < 0: the kernel's error
                completions.append((entry.user_data, None, exc))
        if completions:
            cq_advance(ring, len(completions))
            n_done = 0
            for tag, res, error in completions:
                req = pending[tag]
                if error is None:
                    remaining = req[5] - req[6]
                    if res == remaining:
                        res = req[5]
                    elif res == 0:
                        error = _short_error(req)
                    else:  # short: continue from where it stopped, same tag
                        req[6] += res
                        if req[6] == res:  # first time short: slice by bytes from now on
                            req[3] = req[3].cast("B")
                        prep(tag, req)
                        continue
                del pending[tag]
                free_tags.append(tag)
                future = req[0]
                req.clear()  # hold no buffer past completion
                future._complete(res, error)
                n_done += 1
                if n_done % RESUBMIT_EVERY == 0 and queue:
                    push()  # what the callbacks queued so far goes down before the rest are completed
            continue  # callbacks may have queued more
        if st.stopping and not queue and not pending:
            return
        st.sleeping = True
        if queue and free_tags:  # queued between the drain above and the flag
            st.sleeping = False
            continue
        events = poller.poll(BACKLOG_RETRY_MS if backlog else None)  # releases the GIL
        st.sleeping = False
        if any(fd == wake_fd for fd, _ in events):
            try:
                os.eventfd_read(wake_fd)
            except BlockingIOError:
                pass


def _short_error(req: list) -> BaseException:
    at = req[4] + req[6]
    if req[1] == _READ:
        return EOFError(f"read past end of file at offset {at}")
    return OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (write of 0 bytes at offset {at})")


def _fail_all(st: _Ring, exc: BaseException) -> None:
    """Complete every queued request with ``exc``; later submits raise."""
    with st.lock:
        st.error = exc
        requests = [*st.pending.values(), *st.queue]
        st.pending.clear()
        st.queue.clear()
    for req in requests:
        if req:
            req[0]._complete(None, RuntimeError(f"the io_uring ring thread failed: {exc.__class__.__name__}: {exc}"))


class UringBackend(FdBackend):
    """O_DIRECT reads and writes submitted in batches through one io_uring."""

    name = "uring"

    def __init__(self, *, queue_depth: int = 16, direct: bool = True):
        super().__init__(queue_depth=queue_depth, direct=direct)
        self._lock = threading.Lock()  # orders submits against shutdown
        self._shut_down = False
        self._ring = _Ring(queue_depth, self._lock)
        self._thread = threading.Thread(target=_ring_loop, args=(self._ring,), name="kvstore-io-uring", daemon=True)
        self._thread.start()
        # a backend dropped without shutdown() still lets its ring thread go
        self._finalizer = weakref.finalize(self, _stop, self._ring)

    def pread(self, fh: FileHandle, buf, offset: int) -> UringFuture:
        nbytes = aligned_nbytes(buf, offset) if fh.direct else memoryview(buf).nbytes
        view = memoryview(buf)
        if view.readonly:
            raise TypeError("pread needs a writable buffer")
        return self._submit(_READ, fh.raw, view, offset, nbytes)

    def pwrite(self, fh: FileHandle, buf, offset: int) -> UringFuture:
        if not fh.writable:
            raise ValueError(f"{fh.path} is not open for writing")
        nbytes = aligned_nbytes(buf, offset) if fh.direct else memoryview(buf).nbytes
        return self._submit(_WRITE, fh.raw, memoryview(buf), offset, nbytes)

    def _submit(self, op: int, fd: int, view: memoryview, offset: int, nbytes: int) -> UringFuture:
        future = UringFuture()
        if not nbytes:
            future._complete(0, None)
            return future
        st = self._ring
        with self._lock:
            if self._shut_down or st.closed:
                raise RuntimeError("cannot submit I/O after shutdown")
            if st.error is not None:
                raise RuntimeError(f"the io_uring ring thread failed: {st.error.__class__.__name__}: {st.error}")
            st.queue.append([future, op, fd, view, offset, nbytes, 0, None])
            if st.sleeping:
                st.sleeping = False  # one wake-up is enough
                os.eventfd_write(st.wake_fd, 1)
        return future

    def shutdown(self) -> None:
        """Finish the requests already submitted, then join the ring thread."""
        with self._lock:
            self._shut_down = True
        self._finalizer()  # once
        if threading.current_thread() is not self._thread:  # shutdown from a completion callback
            self._thread.join()
