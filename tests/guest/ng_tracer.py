"""Run mmiotrace-ng in the guest for tests: start, mark sections, stop."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NG = [str(REPO / "tests" / "vm" / "bin" / "mmiotrace-ng")]
ARTIFACTS = REPO / "tests" / "artifacts"
# recordings the host reads after the guests (tests/recorded)
RECORDED = ARTIFACTS / "recorded"
MARKER = Path("/sys/kernel/tracing/trace_marker")
START_TIMEOUT = 300.0   # bcc compiles the BPF programs: slow under TCG


def read_growing(path: Path) -> str:
    """A file another process is appending to, on the checkout's 9p mount:
    on Linux 7.x the 9p client may answer such a read with ENODATA while
    the size changes under it; the read is made again."""
    for _ in range(50):
        try:
            return path.read_text(errors="replace")
        except OSError as exc:
            if exc.errno != errno.ENODATA:
                raise
            time.sleep(0.05)
    return path.read_text(errors="replace")


class NgTracer:
    """One mmiotrace-ng run writing to a file; sections are cut by markers."""

    def __init__(self, args: list[str], name: str) -> None:
        ARTIFACTS.mkdir(exist_ok=True)
        self.out = ARTIFACTS / f"{name}.txt"
        self.raw = ARTIFACTS / f"{name}.raw"
        self.errf = ARTIFACTS / f"{name}.err"
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.seq = 0

    def start(self) -> NgTracer:
        with open(self.errf, "wb") as err:
            self.proc = subprocess.Popen(
                [*NG, "-o", str(self.out), "--raw", str(self.raw), *self.args],
                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if "mmiotrace-ng: ready" in read_growing(self.errf):
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"mmiotrace-ng exited {self.proc.returncode}: "
                                     + self.errf.read_text(errors="replace"))
            time.sleep(0.2)
        raise AssertionError("mmiotrace-ng did not get ready: "
                             + self.errf.read_text(errors="replace"))

    def text(self) -> str:
        return read_growing(self.out)

    def wait_for(self, needle: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.text()
            if needle in text:
                return text
            time.sleep(0.1)
        raise AssertionError(f"{needle!r} never appeared in {self.out}")

    def section(self, trigger) -> str:
        """The lines the tracer printed while trigger() ran."""
        self.seq += 1
        begin, end = f"ng-section-begin-{self.seq}", f"ng-section-end-{self.seq}"
        MARKER.write_text(begin + "\n")
        trigger()
        MARKER.write_text(end + "\n")
        return sections(self.wait_for(end)).get(self.seq, "")

    def stop(self, sig: int = signal.SIGINT, timeout: float = 120.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def stderr(self) -> str:
        return read_growing(self.errf)


def sections(text: str) -> dict[int, str]:
    """Stream text between ng-section-begin-N and ng-section-end-N markers."""
    out: dict[int, str] = {}
    cur: int | None = None
    lines: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("MARK ") and "ng-section-begin-" in line:
            cur, lines = int(line.rsplit("-", 1)[1]), []
        elif line.startswith("MARK ") and "ng-section-end-" in line and cur is not None:
            out[cur] = "".join(lines)
            cur = None
        elif cur is not None:
            lines.append(line)
    return out


def render(raw: Path, compat: bool = False) -> str:
    """What `mmiotrace-ng render [--compat] RAW` prints (in-process: faster)."""
    from mmiotrace_ng.format.rawfile import read_raw
    from mmiotrace_ng.format.render import Renderer

    header, recs = read_raw(str(raw))
    return header + Renderer(compat=compat).feed_batch(recs)


def helper_status() -> dict[str, int]:
    """The helper's counters (what `mmiotrace-ng status` prints), in-process."""
    from mmiotrace_ng.tracer.netlink import HelperSocket

    with HelperSocket() as h:
        return h.status()._asdict()


def copy_in_large_writes(src: Path, dst: Path) -> None:
    """Copy src to dst in writes of 1 MiB: shutil.copyfile's sendfile
    writes to the 9p share a page pipe at a time, 4x slower here (a 337 MB
    recording: 19 s against 5 s)."""
    with src.open("rb") as fin, dst.open("wb", buffering=0) as fout:
        while chunk := fin.read(1 << 20):
            view = memoryview(chunk)
            while view:
                view = view[fout.write(view):]


def recorded_for_host(name: str, argv: list[str], *, bdf: str, bar0: int,
                      **facts: object) -> subprocess.CompletedProcess[str]:
    """Run mmiotrace-ng with argv ("{rec}" in it: the recording's path) to
    make RECORDED/name.rec for the host tests of tests/recorded, with the
    device's address, its BAR 0 and the other facts given beside it in
    name.json; the run's result (its summary on stderr)."""
    RECORDED.mkdir(parents=True, exist_ok=True)
    rec, path = RECORDED / f"{name}.rec", RECORDED / f"{name}.json"
    rec.unlink(missing_ok=True)
    path.unlink(missing_ok=True)
    # written to the guest's tmpfs, copied to the checkout's share after:
    # the 9p client of 6.12 and later writes a 270 MB recording too slowly
    # for the reader to keep up with a 16 MiB blit (a fifth of it lost),
    # which says nothing of the tool (into tmpfs it loses nothing)
    local = Path("/tmp") / f"ng-recorded-{name}.rec"
    local.unlink(missing_ok=True)
    try:
        res = subprocess.run([*NG, *(a.replace("{rec}", str(local)) for a in argv)],
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr
        assert local.stat().st_size > 0, res.stderr
        copy_in_large_writes(local, rec)
    finally:
        local.unlink(missing_ok=True)
    path.write_text(json.dumps({"bdf": bdf, "bar0": bar0, "made": time.time(), **facts}))
    return res
