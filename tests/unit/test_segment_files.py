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
