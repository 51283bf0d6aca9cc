"""`mmiotrace-ng recover`: after a crash and a warm reboot, the flight
recorder's records (tracer/flight.py) as the tracer's text or a recording."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..common.errors import UsageError
from ..common.output import writing
from ..format.render import ENCODING, ERRORS, Renderer
from . import flight


def setup(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("-o", "--output", metavar="FILE",
                    help="also write the records as a recording (read it with: "
                         "mmiotrace-ng report FILE)")
    ap.add_argument("--flight-region", metavar="SIZE@ADDR",
                    help="where the records are (default: the kernel command line's "
                         "memmap=SIZE$ADDR reservation)")
    ap.add_argument("--clear", action="store_true",
                    help="once printed (and written), let the records go: the next --flight "
                         "trace may then use the region")
    ap.add_argument("--pc", action="store_true", help="print instruction addresses")
    ap.add_argument("--helper", metavar="KO", help="helper module to load (default: find or build)")


def _image(args: argparse.Namespace) -> tuple[flight.Region, bytes]:
    from . import kmodload
    from .netlink import HelperError, HelperSocket

    where = flight.region(args.flight_region, Path("/proc/cmdline").read_text())
    if os.geteuid() != 0:
        raise UsageError("must be run as root (the records are read through the helper module)")
    kmodload.ensure_loaded(args.helper)
    try:
        with HelperSocket() as h:
            return where, flight.read_region(h, where)
    except HelperError as exc:
        raise UsageError(f"cannot read the flight region {where}: {exc}") from exc


def _clear(where: flight.Region) -> None:
    """An empty, stopped region: a session that starts recording and ends."""
    from .netlink import HelperError, HelperSocket

    try:
        with HelperSocket() as h:
            h.flight_start(where.addr, where.size, flight.MIN_RECS, "")
            h.disarm_all()
    except HelperError as exc:
        raise UsageError(f"cannot clear the flight region {where}: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    where, image = _image(args)
    try:
        rec = flight.parse(image)
    except flight.FlightError as exc:
        raise UsageError(f"{where}: {exc}") from exc
    payloads = list(flight.payloads(rec))
    header = flight.header_text(rec)
    if args.output:
        from ..format.rawfile import RawWriter
        from .session import recording_meta

        meta = recording_meta()
        meta.update(flight={"region": str(where), "state": rec.state, "why": rec.why(),
                            "crash_cpu": rec.hdr.crash_cpu, "recs": rec.hdr.recs})
        try:
            w = RawWriter(args.output)
            w.meta(meta)
            w.header(header)
            w.records(payloads)
            w.end(0, 0, None, None)
            w.close()
        except OSError as exc:
            raise UsageError(f"cannot write {args.output}: {exc.strerror}") from exc
    r = Renderer(show_pc=args.pc)
    with writing(None) as out:
        out.write(header.encode(ENCODING, ERRORS))
        out.write(r.feed_batch(payloads).encode(ENCODING, ERRORS))
    said = f"{len(rec.accesses)} accesses, the machine {rec.state}"
    if rec.crashed:
        said += f" on CPU {rec.hdr.crash_cpu}: {rec.why()}"
    print(f"mmiotrace-ng: recover: {said}", file=sys.stderr)
    if args.clear:
        _clear(where)
    return 0
