"""RingReader on a file laid out as the kernel lays out a BPF ring buffer."""

from __future__ import annotations

import mmap
import struct

from mmiotrace_ng.common.ringbuf import (
    BUSY,
    DISCARD,
    RingReader,
    next_record,
    pack,
    payloads,
    run_of,
    stride,
)

SIZE = 4096


def ring_file(tmp_path, records: list[tuple[bytes, int]], prod_extra: int = 0):
    """A file: consumer page, producer page, data (records at 0), flags per record."""
    page = mmap.PAGESIZE
    data = bytearray(2 * SIZE)
    pos = 0
    for payload, flags in records:
        struct.pack_into("<II", data, pos, len(payload) | flags, 0)
        data[pos + 8:pos + 8 + len(payload)] = payload
        pos += (len(payload) + 8 + 7) & ~7
    path = tmp_path / "ring"
    body = bytearray(page) + bytearray(page) + data
    struct.pack_into("<Q", body, page, pos + prod_extra)     # producer position
    path.write_bytes(bytes(body))
    return path


def read(reader: RingReader) -> list[bytes]:
    """Copies of the committed records, as the tracer takes them: pending,
    then consume what was used."""
    view = reader.pending()
    out, used = payloads(view)
    view.release()
    reader.consume(used)
    return out


def open_reader(path) -> tuple[RingReader, object]:
    fh = open(path, "r+b")
    return RingReader(fh.fileno(), SIZE, pollable=False), fh


def test_reads_records_in_order_and_skips_discarded(tmp_path):
    recs = [(b"a" * 5, 0), (b"b" * 64, DISCARD), (b"c" * 16, 0)]
    reader, fh = open_reader(ring_file(tmp_path, recs))
    assert read(reader) == [b"a" * 5, b"c" * 16]
    assert read(reader) == []              # the consumer position moved
    cons = struct.unpack_from("<Q", reader.cons_map, 0)[0]
    assert cons == 16 + 72 + 24
    reader.close()
    fh.close()


def test_stops_at_a_record_still_being_written(tmp_path):
    recs = [(b"x" * 8, 0), (b"y" * 8, BUSY), (b"z" * 8, 0)]
    reader, fh = open_reader(ring_file(tmp_path, recs))
    assert read(reader) == [b"x" * 8]
    assert struct.unpack_from("<Q", reader.cons_map, 0)[0] == 16
    reader.close()
    fh.close()


def test_record_wrapping_around_the_end(tmp_path):
    """A record that starts 16 bytes before the end of the data area continues
    in the second mapping of the same pages; positions keep growing."""
    page = mmap.PAGESIZE
    ring = bytearray(SIZE)
    start = 3 * SIZE - 16                     # the fourth lap, near its end
    payload = bytes(range(40))
    rec = struct.pack("<II", len(payload), 0) + payload
    for i, b in enumerate(rec):               # as the kernel writes it: wrapped
        ring[(start + i) % SIZE] = b
    body = bytearray(page) + bytearray(page) + ring + ring
    struct.pack_into("<Q", body, 0, start)                      # consumer
    struct.pack_into("<Q", body, page, start + 48)              # producer
    path = tmp_path / "ring"
    path.write_bytes(bytes(body))
    reader, fh = open_reader(path)
    assert read(reader) == [payload]
    assert struct.unpack_from("<Q", reader.cons_map, 0)[0] == start + 48
    reader.close()
    fh.close()


def test_pending_and_consume(tmp_path):
    recs = [(b"a" * 5, 0), (b"b" * 64, DISCARD), (b"c" * 16, BUSY)]
    reader, fh = open_reader(ring_file(tmp_path, recs))
    view = reader.pending()
    assert len(view) == 16 + 72 + 24
    assert next_record(view, 0) == (16, b"a" * 5)
    assert next_record(view, 16) == (88, None)          # discarded: skipped
    assert next_record(view, 88) is None                # still being written
    assert payloads(view) == ([b"a" * 5], 88)
    del view
    reader.consume(88)
    assert struct.unpack_from("<Q", reader.cons_map, 0)[0] == 88
    assert len(reader.pending()) == 24
    reader.close()
    fh.close()


def test_run_of_counts_leading_records_of_one_length():
    body = [b"x" * 72] * 5 + [b"y" * 40] + [b"z" * 72] * 3
    image = bytearray(pack(body))
    assert run_of(memoryview(image), 72, 100) == 5
    assert run_of(memoryview(image), 72, 3) == 3
    assert run_of(memoryview(image), 40, 100) == 0
    image[stride(72) * 2 + 3] |= BUSY >> 24             # the third is being written
    assert run_of(memoryview(image), 72, 100) == 2
    image[3] |= DISCARD >> 24
    assert run_of(memoryview(image), 72, 100) == 0


def test_pack_is_what_the_reader_reads():
    body = [bytes([i]) * n for i, n in enumerate([1, 8, 9, 72, 0, 15])]
    image = pack(body)
    assert len(image) == sum(stride(len(b)) for b in body)
    assert payloads(memoryview(image)) == (body, len(image))


def test_payloads_stops_at_the_limit():
    recs = [bytes([i]) * (i + 1) for i in range(5)]
    image = memoryview(pack(recs))
    got, used = payloads(image, 3)
    assert got == recs[:3]
    assert used == sum(stride(len(r)) for r in recs[:3])
    assert payloads(image) == (recs, len(image))
