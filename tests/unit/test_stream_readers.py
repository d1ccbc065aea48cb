"""``stream_readers.Readers``: a reader runs on an idle kept thread, a new one only when none is idle."""

import threading

from engine_client.stream_readers import Readers


def _threads() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.name == "kvstore-prefetch-reader"}


def test_readers_one_after_another_share_one_thread_and_survive_an_error():
    readers, ran, done = Readers(), [], threading.Event()
    before = _threads()
    for i in range(20):
        finished = threading.Event()

        def work(i=i, finished=finished):
            ran.append((i, threading.get_ident()))
            finished.set()
            if i == 3:
                raise RuntimeError("a reader's own error")

        readers.run(work)
        finished.wait(10)
        while readers._idle == 0:  # the thread counts itself idle just after the work returns
            done.wait(0.001)
    assert [i for i, _ in ran] == list(range(20))
    assert len({ident for _, ident in ran}) == 1  # every one on the same kept thread, the error included
    assert len(_threads() - before) == 1


def test_readers_at_once_each_get_a_thread():
    readers, gate, started = Readers(), threading.Event(), []
    lock = threading.Lock()

    def blocked():
        with lock:
            started.append(threading.get_ident())
        gate.wait(10)

    for _ in range(4):
        readers.run(blocked)
    deadline = threading.Event()
    for _ in range(1000):
        if len(started) == 4:
            break
        deadline.wait(0.01)
    assert len(set(started)) == 4  # none waits behind another: a blocked reader never stalls the next stream
    gate.set()
