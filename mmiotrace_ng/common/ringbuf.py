"""Read a BPF ring buffer (BPF_MAP_TYPE_RINGBUF) through its mmap.

bcc's reader calls a Python function for every record, which costs more
than rendering the record.  This reads the kernel's layout directly
(kernel/bpf/ringbuf.c): page 0 holds the consumer position (writable),
page 1 the producer position, and the data pages follow, mapped twice in a
row so that everything between the two positions is contiguous.  Each
record starts with an 8-byte header: u32 length (bit 31: still being
written, bit 30: discarded) and u32 page offset; records are 8-byte aligned.

The reader hands out the pending bytes as a memoryview (`pending`) and is
told how many were used (`consume`): the renderer works on the ring's
memory in place, without a bytes object per record.

The positions are loaded and stored as whole 8-byte words (typed
memoryviews): struct.pack_into first zeroes its target and then writes byte
by byte, so the kernel could see a torn consumer position.
"""

from __future__ import annotations

import mmap
import select
import struct
from collections.abc import Iterable
from itertools import chain

BUSY = 1 << 31
DISCARD = 1 << 30
HEADER = 8
_PEEK = 16       # headers run_of looks at before it looks further


def stride(length: int) -> int:
    """Bytes a record with `length` bytes of data takes in the ring."""
    return (length + HEADER + 7) & ~7


def run_of(view: memoryview, length: int, limit: int) -> int:
    """How many records at the start of view are committed, not discarded and
    exactly `length` bytes long (at most limit).

    The headers are read in strided loads: each header that says `length`
    (no flag bits) puts the next record one stride further on, so the
    answer is the number of leading matches.  A short look first keeps
    streams of other records cheap."""
    step = stride(length) // 4
    words = view.cast("I")
    if not words or words[0] != length:
        return 0
    n = min(limit, _PEEK)
    heads = words[: n * step : step].tolist()
    if heads.count(length) == len(heads) and limit > n:
        heads = words[: limit * step : step].tolist()
    if heads.count(length) == len(heads):
        return len(heads)
    return list(map(length.__eq__, heads)).index(False)


def next_record(
    view: memoryview, pos: int, words: memoryview | None = None
) -> tuple[int, memoryview | None] | None:
    """(position after it, its data or None if discarded) of the record at
    pos, or None if it is still being written or pos is the end.  words:
    view.cast("I"), if the caller has it."""
    if pos >= len(view):
        return None
    length = (words if words is not None else view.cast("I"))[pos >> 2]
    if length & BUSY:
        return None
    end = pos + stride(length & ~DISCARD)
    if length & DISCARD:
        return end, None
    return end, view[pos + HEADER : pos + HEADER + length]


def payloads(view: memoryview, limit: int | None = None) -> tuple[list[bytes], int]:
    """Copies of the committed records at the start of view (discarded ones
    skipped, at most limit) and the bytes they and the skipped ones take."""
    out: list[bytes] = []
    pos = 0
    words = view.cast("I")
    while (limit is None or len(out) < limit) and (
            rec := next_record(view, pos, words)) is not None:
        pos, data = rec
        if data is not None:
            out.append(bytes(data))
    return out, pos


def committed(view: memoryview, run_length: int,
              limit: int | None = None) -> tuple[int, int, list[memoryview]]:
    """The whole records at the start of view, for copying them as they are:
    (bytes they take, how many are run_length bytes long, the data of the
    others; discarded ones count as neither).  It stops before a record still
    being written, one that runs past the end of view (a torn copy), or when
    about limit records are counted.  Runs of run_length records are counted
    with run_of's strided loads, not one by one."""
    pos = runs = 0
    others: list[memoryview] = []
    end = len(view)
    left = limit if limit is not None else end
    words = view[: end & ~3].cast("I")
    step = stride(run_length)
    while pos + HEADER <= end and left > 0:
        n = run_of(view[pos : end & ~7], run_length, min(left, (end - pos) // step))
        if n:
            pos += n * step
            runs += n
            left -= n
            continue
        length = words[pos >> 2]
        nxt = pos + stride(length & ~DISCARD)
        if length & BUSY or nxt > end:
            break
        if not length & DISCARD:
            others.append(view[pos + HEADER : pos + HEADER + length])
        pos = nxt
        left -= 1
    return pos, runs, others


class _Framing(dict):
    """length -> (header, padding) of a committed record in the ring."""

    def __missing__(self, length: int) -> tuple[bytes, bytes]:
        self[length] = framing = (struct.pack("=II", length, 0),
                                  bytes(stride(length) - HEADER - length))
        return framing


def pack(records: Iterable[bytes | bytearray | memoryview]) -> bytes:
    """The ring's image of these records, committed, one after the other (for
    replays and tests: what `pending` would show)."""
    recs = list(records)
    framing = _Framing()
    frames = list(map(framing.__getitem__, map(len, recs)))
    heads = [f[0] for f in frames]
    pads = [f[1] for f in frames]
    return b"".join(chain.from_iterable(zip(heads, recs, pads, strict=True)))


class RingReader:
    """Consumer of one BPF ring buffer map (map_fd) of size data bytes."""

    def __init__(self, map_fd: int, size: int, pollable: bool = True) -> None:
        if size & (size - 1):
            raise ValueError("ring buffer size must be a power of two")
        page = mmap.PAGESIZE
        self.mask = size - 1
        self.cons_map = mmap.mmap(map_fd, page, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self.prod_map = mmap.mmap(map_fd, page + 2 * size, mmap.MAP_SHARED,
                                  mmap.PROT_READ, offset=page)
        self.data = memoryview(self.prod_map)[page:]
        self.cons = memoryview(self.cons_map).cast("Q")
        self.prod = memoryview(self.prod_map)[:8].cast("Q")
        self.poller = select.epoll()
        if pollable:        # a ring buffer map is; a file standing in for one is not
            self.poller.register(map_fd, select.EPOLLIN)

    def pending(self) -> memoryview:
        """The bytes from the consumer to the producer position: whole
        records, the last ones possibly still being written."""
        cons = self.cons[0]
        prod = self.prod[0]
        off = cons & self.mask
        return self.data[off : off + (prod - cons)]

    def consume(self, nbytes: int) -> None:
        """Give the first nbytes of `pending` back to the producer (after
        everything in them has been copied out)."""
        if nbytes:
            self.cons[0] = self.cons[0] + nbytes

    def wait(self, timeout_ms: int) -> None:
        """Until the kernel signals new data or timeout_ms pass."""
        self.poller.poll(timeout_ms / 1000)

    def close(self) -> None:
        self.poller.close()
        for view in (self.cons, self.prod, self.data):
            view.release()
        self.cons_map.close()
        try:
            self.prod_map.close()
        except BufferError:
            # a view of pending records still referenced (by an exception's
            # traceback): the mapping goes when that does
            pass
