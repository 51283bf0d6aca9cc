"""The recording that annotate, export and plot are tested on: the
exerciser's readl, writel, a poll of 300 reads and a burst of 500 reads on
each of two CPUs, recorded here; the host checks the tools' output after
the guests (tests/recorded/test_analysis.py), where they run in seconds."""

from __future__ import annotations

from pathlib import Path

from ng_tracer import recorded_for_host

RUN = Path("/sys/kernel/debug/edu_exerciser/run")
STEPS = ["readl", "writel", "rloop 300", "burst 500"]


def test_the_analysis_recording_is_made(exerciser):
    rec = recorded_for_host("analysis", exerciser, [
        "record", "--pci", exerciser.dev.name, "-o", "{rec}", "--", "sh", "-c",
        "; ".join(f"echo '{s}' > {RUN}" for s in STEPS)])
    assert rec.stat().st_size > 0
