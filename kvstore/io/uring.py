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

Binding: the two system calls through ctypes (``_Ring``: ``io_uring_setup``,
the rings mapped with ``mmap``, 64-byte SQEs and 16-byte CQEs packed with
``struct``; IORING_OP_READ/WRITE, kernel 5.6 or later).  The ``liburing``
package on PyPI (2026.3.30) was tried first and measured unusable here:

- it leaks a buffer export per ``Iovec``: after 100 ``Iovec([view])`` the
  memoryview reported 100 exported buffers, so no buffer read through it is
  ever freed - the chunked-read benchmark, which reads into fresh buffers,
  grew to 18 GB of shared memory and was killed by the OOM killer;
- its blocking waits (``io_uring_wait_cqe``, ``io_uring_submit_and_wait``)
  hold the GIL: a thread waiting in ``io_uring_wait_cqe`` on an idle ring
  stopped the whole process (a million-iteration loop on the main thread had
  not finished after 10 s);
- ``io_uring_prep_read``/``prep_write`` take a ``bytearray`` only (mmap
  memory, memoryviews and numpy arrays are refused).

ctypes releases the GIL around ``syscall``, buffer addresses come from
``base.buffer_address`` (no export kept), and the ring thread still waits in
``select.poll``.  The rings are read and written without memory barriers,
which x86-64's store and load ordering makes safe; other architectures fall
back to posix (``unavailable_reason`` says so).

Measured on the shared 2-vCPU development VM (README, "Raw I/O against
fio"): a 32 KiB O_DIRECT random read costs 13-18 us of process CPU this
way, the posix pool 13-16 us (most of it is the kernel's either way); at
256 KiB-1 MiB up to a third less than posix.  One thread doing everything
is also the weak point: when CPUs are oversubscribed the ring thread waits
in the run queue with the whole batch, and there posix's 16 threads kept
closer to fio; so ``auto`` does not choose this backend.

Why ~450 lines in one file: the ring binding and the thread that drives it
share the ring's memory layout and its one-thread ownership rule; apart,
each half would be unsafe to use without the other.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import mmap
import os
import platform
import select
import struct
import tempfile
import threading
import weakref
from collections import deque

from ..faults import armed, crash_point
from .base import FileHandle, aligned_nbytes, buffer_address
from .future import Future
from .posix import FdBackend

log = logging.getLogger(__name__)

_READ_STEP_ARMED = armed("read:io")  # read once at import, like the fault variables

PROBE_TIMEOUT_MS = 2000  # the probe's read of a page-cache file takes microseconds
# Completions handled between two submits: requests resubmitted by the first
# callbacks reach the device while the rest of the batch is still completed.
RESUBMIT_EVERY = 4
BACKLOG_RETRY_MS = 1  # submission refused for now (EAGAIN, EBUSY): try again this soon
# io_uring_enter errors that mean "reap first, then submit again"
_RETRY_SUBMIT = (errno.EINTR, errno.EAGAIN, errno.EBUSY)

# <linux/io_uring.h>; the syscall numbers are the same on every architecture
_NR_SETUP, _NR_ENTER = 425, 426
_OP_READ, _OP_WRITE = 22, 23
_OFF_SQ_RING, _OFF_CQ_RING, _OFF_SQES = 0, 0x8000000, 0x10000000
_FEAT_SINGLE_MMAP = 1
_SQ_CQ_OVERFLOW = 1 << 1  # sq ring flag: completions wait in the kernel's overflow list
_ENTER_GETEVENTS = 1
_SQE = struct.Struct(
    "<BBHiQQIIQHHiQQ"
)  # opcode flags ioprio fd off addr len rw_flags user_data buf_index personality splice_fd_in addr3 pad
_CQE = struct.Struct("<QiI")  # user_data res flags
_U32 = struct.Struct("<I")
_MASK32 = 0xFFFFFFFF


class _SqOffsets(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("head", "tail", "ring_mask", "ring_entries", "flags", "dropped", "array", "resv1")] + [
        ("user_addr", ctypes.c_uint64)
    ]


class _CqOffsets(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("head", "tail", "ring_mask", "ring_entries", "overflow", "cqes", "flags", "resv1")] + [
        ("user_addr", ctypes.c_uint64)
    ]


class _Params(ctypes.Structure):
    _fields_ = [
        *((n, ctypes.c_uint32) for n in ("sq_entries", "cq_entries", "flags", "sq_thread_cpu", "sq_thread_idle", "features", "wq_fd")),
        ("resv", ctypes.c_uint32 * 3),
        ("sq_off", _SqOffsets),
        ("cq_off", _CqOffsets),
    ]


_libc = ctypes.CDLL(None, use_errno=True)  # CDLL: the GIL is released during each call
_setup = _libc["syscall"]  # [] makes a function object of its own, with its own argtypes
_setup.restype, _setup.argtypes = ctypes.c_long, (ctypes.c_long, ctypes.c_long, ctypes.c_void_p)
_enter = _libc["syscall"]
_enter.restype = ctypes.c_long
_enter.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_long)


def _check(ret: int) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


class _Ring:
    """One io_uring: its fd and mapped rings; used by one thread at a time."""

    def __init__(self, entries: int):
        params = _Params()
        self.fd = _check(_setup(_NR_SETUP, entries, ctypes.addressof(params)))
        try:
            sq, cq = params.sq_off, params.cq_off
            sq_size = sq.array + params.sq_entries * 4
            cq_size = cq.cqes + params.cq_entries * _CQE.size
            if params.features & _FEAT_SINGLE_MMAP:
                self.sq_mm = self.cq_mm = self._map(max(sq_size, cq_size), _OFF_SQ_RING)
            else:
                self.sq_mm, self.cq_mm = self._map(sq_size, _OFF_SQ_RING), self._map(cq_size, _OFF_CQ_RING)
            self.sqes = self._map(params.sq_entries * _SQE.size, _OFF_SQES)
        except BaseException:
            os.close(self.fd)
            raise
        self.sq_entries = params.sq_entries
        self.sq_mask = _U32.unpack_from(self.sq_mm, sq.ring_mask)[0]
        self.cq_mask = _U32.unpack_from(self.cq_mm, cq.ring_mask)[0]
        self.sq_head_off, self.sq_tail_off, self.sq_flags_off = sq.head, sq.tail, sq.flags
        self.cq_head_off, self.cq_tail_off, self.cqes_off = cq.head, cq.tail, cq.cqes
        for i in range(params.sq_entries):  # SQE i always sits at index i of the array
            _U32.pack_into(self.sq_mm, sq.array + 4 * i, i)
        self.sq_tail = _U32.unpack_from(self.sq_mm, sq.tail)[0]  # ours, written to the ring at submit
        self.cq_head = _U32.unpack_from(self.cq_mm, cq.head)[0]

    def _map(self, size: int, offset: int) -> mmap.mmap:
        return mmap.mmap(self.fd, size, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)

    def prep(self, opcode: int, fd: int, addr: int, nbytes: int, offset: int, user_data: int) -> None:
        """Write one SQE; the caller keeps fewer than sq_entries unsubmitted."""
        _SQE.pack_into(
            self.sqes, (self.sq_tail & self.sq_mask) * _SQE.size, opcode, 0, 0, fd, offset, addr, nbytes, 0, user_data, 0, 0, 0, 0, 0
        )
        self.sq_tail = (self.sq_tail + 1) & _MASK32

    def unsubmitted(self) -> int:
        return (self.sq_tail - _U32.unpack_from(self.sq_mm, self.sq_head_off)[0]) & _MASK32

    def submit(self) -> int:
        """Publish the new SQEs and hand them to the kernel with one io_uring_enter."""
        _U32.pack_into(self.sq_mm, self.sq_tail_off, self.sq_tail)
        return _check(_enter(_NR_ENTER, self.fd, self.unsubmitted(), 0, 0, None, 0))

    def reap(self) -> list[tuple[int, int]]:
        """The completions posted so far, as ``(user_data, res)``, and free their slots.

        Completions the kernel could not post to the ring wait in its overflow
        list (and every later one queues behind them, while the ring fd polls
        readable) until an io_uring_enter with GETEVENTS moves them over.
        """
        if _U32.unpack_from(self.sq_mm, self.sq_flags_off)[0] & _SQ_CQ_OVERFLOW:
            _check(_enter(_NR_ENTER, self.fd, 0, 0, _ENTER_GETEVENTS, None, 0))
        tail = _U32.unpack_from(self.cq_mm, self.cq_tail_off)[0]
        head = self.cq_head
        if head == tail:
            return []
        mm, base, mask = self.cq_mm, self.cqes_off, self.cq_mask
        out = [_CQE.unpack_from(mm, base + ((head + i) & mask) * _CQE.size)[:2] for i in range((tail - head) & _MASK32)]
        self.cq_head = tail
        _U32.pack_into(mm, self.cq_head_off, tail)
        return out

    def close(self) -> None:
        """Unmap and close; the kernel cancels whatever is still in flight."""
        for mm in {id(m): m for m in (self.sqes, self.sq_mm, self.cq_mm)}.values():
            mm.close()
        os.close(self.fd)


@functools.cache
def unavailable_reason() -> str | None:
    """None when io_uring works here (a ring was set up and did a tiny read), else why not.

    Probed once per process: an x86-64 machine, ``io_uring_setup``
    permitted (``kernel.io_uring_disabled`` and container seccomp profiles
    refuse it), and an IORING_OP_READ through the ring returning the bytes
    written.
    """
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the io_uring backend runs on x86-64 only (its rings are read without memory barriers), not {platform.machine()}"
    try:
        return _probe_read()
    except OSError as exc:
        if exc.errno == errno.ENOSYS:
            return "the kernel has no io_uring (io_uring_setup: ENOSYS)"
        if exc.errno == errno.EPERM:
            return "io_uring is not permitted here (io_uring_setup: EPERM; sysctl kernel.io_uring_disabled or a seccomp profile)"
        return f"io_uring failed ({exc.__class__.__name__}: {exc})"


def _probe_read() -> str | None:
    expected = b"kvstore io_uring probe"
    ring = _Ring(2)
    try:
        with tempfile.TemporaryFile() as f:
            f.write(expected)
            f.flush()
            buf = bytearray(len(expected))
            ring.prep(_OP_READ, f.fileno(), buffer_address(buf), len(buf), 0, 7)
            ring.submit()
            poller = select.poll()
            poller.register(ring.fd, select.POLLIN)
            if not poller.poll(PROBE_TIMEOUT_MS):
                return f"a probe read through io_uring did not complete in {PROBE_TIMEOUT_MS} ms"
            ((tag, res),) = ring.reap()
            if res < 0:
                return f"a probe read through io_uring failed: {os.strerror(-res)} (IORING_OP_READ needs kernel 5.6)"
            if bytes(buf[:res]) != expected:
                return f"a probe read through io_uring returned {bytes(buf[:res])!r}"
    finally:
        ring.close()
    return None


class UringFuture(Future):
    """A request's future, completed (and its callbacks run) on the ring thread."""

    __slots__ = ()


class _Shared:
    """What the ring thread and the submitters share; never the backend itself,
    so a backend dropped without ``shutdown`` is collected and lets its thread go."""

    def __init__(self, depth: int, lock: threading.Lock):
        self.ring = _Ring(depth)
        self.wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.depth = depth
        self.lock = lock  # the backend's submit lock
        self.queue: deque = deque()  # [future, opcode, fd, view, offset, nbytes, done]
        self.pending: dict[int, list] = {}  # tag (user_data) -> request, while the kernel has it
        self.sleeping = False  # the ring thread is (about to be) in poll: wake it
        self.stopping = False
        self.closed = False
        self.error: BaseException | None = None  # the ring thread failed: refuse new requests
        self.enters = 0  # io_uring_enter calls that submitted
        self.submitted = 0  # requests (and continuations) they carried
        self.peak_in_flight = 0  # most requests the ring held at once


def _stop(st: _Shared) -> None:
    """Ask the ring thread to finish the queued requests and exit."""
    with st.lock:
        if st.closed or st.stopping:
            return
        st.stopping = True
        os.eventfd_write(st.wake_fd, 1)


def _ring_loop(st: _Shared) -> None:
    """The ring thread: submit what is queued, reap, complete; sleep when idle."""
    try:
        _serve(st)
    except BaseException as exc:  # a bug or a broken ring: fail every request rather than hang it
        # (requests still in the kernel are cancelled when the ring is closed)
        log.exception("io_uring ring thread failed")
        _fail_all(st, exc)
    finally:
        with st.lock:
            st.closed = True
            os.close(st.wake_fd)
            st.ring.close()


def _serve(st: _Shared) -> None:
    ring, queue, pending = st.ring, st.queue, st.pending
    free_tags = list(range(st.depth))
    poller = select.poll()
    poller.register(ring.fd, select.POLLIN)
    poller.register(st.wake_fd, select.POLLIN)
    wake_fd = st.wake_fd
    prep_sqe = ring.prep

    def prep(tag: int, req: list) -> None:
        done = req[6]
        prep_sqe(req[1], req[2], buffer_address(req[3]) + done, req[5] - done, req[4] + done, tag)

    def push() -> bool:
        """Move queued requests into the ring and submit them; True when some stayed behind."""
        while queue and free_tags:
            req = queue.popleft()
            if _READ_STEP_ARMED and req[1] == _OP_READ:  # a test holds the read here (KVSTORE_PAUSE_AT=read:io:<seconds>)
                crash_point("read:io")  # on the ring thread: later requests wait behind it
            try:
                prep(free_tags[-1], req)
            except Exception as exc:  # a buffer whose address cannot be read: that request fails, the ring goes on
                future = req[0]
                req.clear()
                future._complete(None, exc)
                continue
            pending[free_tags.pop()] = req
        if len(pending) > st.peak_in_flight:
            st.peak_in_flight = len(pending)
        if not ring.unsubmitted():
            return False
        try:
            st.submitted += ring.submit()  # one io_uring_enter for the whole batch
            st.enters += 1
        except OSError as exc:
            if exc.errno not in _RETRY_SUBMIT:
                raise
        return ring.unsubmitted() > 0  # the kernel took part of the batch: submit the rest soon

    while True:
        backlog = push()
        completions = ring.reap()
        if completions:
            n_done = 0
            for tag, res in completions:
                req = pending[tag]
                error = None
                if res < 0:
                    error = OSError(-res, os.strerror(-res))
                elif res == req[5] - req[6]:
                    res = req[5]
                elif res == 0:
                    error = _short_error(req)
                else:  # short: continue from where it stopped, same tag
                    req[6] += res
                    prep(tag, req)
                    continue
                del pending[tag]
                free_tags.append(tag)
                future = req[0]
                req.clear()  # hold no buffer past completion
                future._complete(None if error else res, error)
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
    if req[1] == _OP_READ:
        return EOFError(f"read past end of file at offset {at}")
    return OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (write of 0 bytes at offset {at})")


def _fail_all(st: _Shared, exc: BaseException) -> None:
    """Complete every request not yet completed with ``exc``; later submits raise."""
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
        self._ring = _Shared(queue_depth, self._lock)
        self._thread = threading.Thread(target=_ring_loop, args=(self._ring,), name="kvstore-io-uring", daemon=True)
        self._thread.start()
        # a backend dropped without shutdown() still lets its ring thread go
        self._finalizer = weakref.finalize(self, _stop, self._ring)

    def pread(self, fh: FileHandle, buf, offset: int) -> UringFuture:
        nbytes = aligned_nbytes(buf, offset) if fh.direct else memoryview(buf).nbytes
        view = memoryview(buf)
        if view.readonly:
            raise BufferError("pread needs a writable buffer")
        return self._submit(_OP_READ, fh.raw, view, offset, nbytes)

    def pwrite(self, fh: FileHandle, buf, offset: int) -> UringFuture:
        if not fh.writable:
            raise ValueError(f"{fh.path} is not open for writing")
        nbytes = aligned_nbytes(buf, offset) if fh.direct else memoryview(buf).nbytes
        return self._submit(_OP_WRITE, fh.raw, memoryview(buf), offset, nbytes)

    def _submit(self, opcode: int, fd: int, view: memoryview, offset: int, nbytes: int) -> UringFuture:
        if not view.c_contiguous:
            raise ValueError("io_uring I/O needs one contiguous buffer")
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
            st.queue.append([future, opcode, fd, view, offset, nbytes, 0])
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
