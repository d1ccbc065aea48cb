"""``SegmentFiles``: a segment served from memory while its file is written, then from the file (real files, O_DIRECT)."""

import os

import numpy as np
import pytest

from kvstore.io import PosixBackend, aligned_buffer
from kvstore.segment_files import MemorySegment, SegmentFiles


@pytest.fixture
def files(tmp_path):
    backend = PosixBackend(queue_depth=4, direct=True)
    f = SegmentFiles(str(tmp_path), backend)
    yield f
    f.close_all()
    backend.shutdown()


def test_reads_come_from_memory_until_it_stops_then_from_the_file(files):
    image = np.frombuffer(aligned_buffer(3 * 4096), dtype=np.uint8)
    image[:] = np.arange(image.size) % 251
    files.serve_from_memory(7, image)
    buf = aligned_buffer(4096)
    with files.reading(7) as fh:  # no file exists yet
        assert isinstance(fh, MemorySegment)
        assert files.pread(fh, buf, 4096).result() == 4096
    assert bytes(buf) == image[4096:8192].tobytes()
    with files.reading(7) as fh, pytest.raises(EOFError, match="past its end"):
        files.pread(fh, aligned_buffer(8192), 8192).result()
    with open(files.path(7), "wb") as out:  # the file, as its write leaves it
        out.write((image[::-1]).tobytes())
        os.fsync(out.fileno())
    files.stop_serving_from_memory(7)
    with files.reading(7) as fh:
        assert not isinstance(fh, MemorySegment)
        files.pread(fh, buf, 0).result()
    assert bytes(buf) == image[::-1][:4096].tobytes()


def test_a_memory_image_is_released_only_when_no_longer_served_and_no_reader_holds_it(files):
    memory = files.serve_from_memory(3, aligned_buffer(4096))
    with files.reading(3) as fh:
        assert fh is memory
        assert not files.released(memory)  # still served
        files.stop_serving_from_memory(3)
        assert not files.released(memory)  # a reader holds it: its buffer must not be reused yet
    assert files.released(memory)
    again = files.serve_from_memory(3, aligned_buffer(4096))
    assert files.released(memory) and not files.released(again)  # a newer image of the segment is another one


def test_kept_buffers_come_back_zeroed_and_within_their_bound():
    from kvstore.io import KeptBuffers

    kept = KeptBuffers(max_bytes=3 * 8192)
    first = kept.take(8192)
    np.frombuffer(first, dtype=np.uint8)[:] = 7
    assert kept.give(first) and kept.kept_bytes == 8192
    again = kept.take(8192)
    assert again is first and not np.frombuffer(again, dtype=np.uint8).any()  # the same memory, as fresh
    assert kept.kept_bytes == 0
    other = kept.take(4096)  # no kept buffer of that size: a fresh one
    assert other.nbytes == 4096 and other is not first
    assert kept.give(first) and kept.give(aligned_buffer(8192)) and not kept.give(aligned_buffer(16384))  # over the bound
    assert kept.kept_bytes == 16384
