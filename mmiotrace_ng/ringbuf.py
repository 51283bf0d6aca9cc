"""Read a BPF ring buffer (BPF_MAP_TYPE_RINGBUF) through its mmap, in batches.

bcc's reader calls a Python function for every record, which costs more
than rendering the record.  This reads the kernel's layout directly
(kernel/bpf/ringbuf.c): page 0 holds the consumer position (writable),
page 1 the producer position, and the data pages follow, mapped twice in a
row so a record that wraps around is contiguous.  Each record starts with
an 8-byte header: u32 length (bit 31: still being written, bit 30:
discarded) and u32 page offset; records are 8-byte aligned.

The positions are loaded and stored as whole 8-byte words (typed
memoryviews): struct.pack_into first zeroes its target and then writes byte
by byte, so the kernel could see a torn consumer position.
"""

from __future__ import annotations

import mmap
import select

BUSY = 1 << 31
DISCARD = 1 << 30


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
        self.words = self.data.cast("I")      # record headers, one load each
        self.poller = select.epoll()
        if pollable:        # a ring buffer map is; a file standing in for one is not
            self.poller.register(map_fd, select.EPOLLIN)

    def read(self, limit: int = 1 << 20) -> list[bytes]:
        """Committed records, oldest first, at most limit of them."""
        cons = self.cons[0]
        prod = self.prod[0]
        data, words, mask, out = self.data, self.words, self.mask, []
        while cons < prod and len(out) < limit:
            off = cons & mask
            length = words[off >> 2]
            if length & BUSY:
                break
            cons += (((length & ~DISCARD) + 8) + 7) & ~7
            if not length & DISCARD:
                out.append(bytes(data[off + 8:off + 8 + length]))
        self.cons[0] = cons   # after the copies: the producer may reuse the space
        return out

    def wait(self, timeout_ms: int) -> None:
        """Until the kernel signals new data or timeout_ms pass."""
        self.poller.poll(timeout_ms / 1000)

    def close(self) -> None:
        self.poller.close()
        self.words.release()
        self.cons.release()
        self.prod.release()
        self.data.release()
        self.prod_map.close()
        self.cons_map.close()
