"""The recordings the analysis tools are tested on, made here; the host
checks what the tools make of them after the guests (tests/recorded),
where they run in seconds:
- analysis: the exerciser's readl, writel, a poll of 300 reads and a burst
  of 500 reads on each of two CPUs, and this machine's /proc/kallsyms
  beside it (annotate, export, plot; annotate --kallsyms, --regs);
- sections-a and sections-b: the same sections cut by markers, the second
  with one more in the middle (diff --by-marker);
- lossy: a 64 KiB blit into a 4 KiB ring, which loses most of its records
  (diff --allow-lost)."""

from __future__ import annotations

from pathlib import Path

from ng_tracer import RECORDED, recorded_for_host

RUN = Path("/sys/kernel/debug/edu_exerciser/run")
STEPS = ["readl", "writel", "rloop 300", "burst 500"]
SECTIONS = {"sections-a": [("init", "readl"), ("run", "writel")],
            "sections-b": [("init", "readl"), ("extra", "rloop 3"), ("run", "writel")]}
BLIT = 0x10000
MARKER = "/sys/kernel/tracing/trace_marker"


def edu(exerciser) -> dict:
    """The facts of the edu device a recording for the host traced."""
    return {"bdf": exerciser.dev.name, "bar0": exerciser.bar0[0]}


def steps(*scenarios: str) -> str:
    return "; ".join(f"echo '{s}' > {RUN}" for s in scenarios)


def test_the_analysis_recording_is_made(exerciser):
    recorded_for_host("analysis", [
        "record", "--pci", exerciser.dev.name, "-o", "{rec}", "--", "sh", "-c", steps(*STEPS)],
        **edu(exerciser))
    # the exerciser stays loaded: its functions are where they were
    kallsyms = Path("/proc/kallsyms").read_text()
    assert " sc_readl\t[edu_exerciser]" in kallsyms
    (RECORDED / "analysis.kallsyms").write_text(kallsyms)


def test_the_section_recordings_are_made(exerciser):
    # trace_marker written by the shell (`mmiotrace-ng mark` starts an
    # interpreter each time: seconds here; test_ng_trace.py tests it)
    for name, sections in SECTIONS.items():
        script = "; ".join(f"echo {text} > {MARKER}; {steps(step)}" for text, step in sections)
        recorded_for_host(name, [
            "record", "--pci", exerciser.dev.name, "-o", "{rec}", "--", "sh", "-c", script],
            **edu(exerciser))


def test_the_lossy_recording_is_made(exerciser):
    """One memcpy_toio of 64 KiB: 16384 stores, rep_chunk (64) a trap,
    each trap's records more than a ring of 4 KiB holds."""
    recorded_for_host("lossy", [
        "record", "--pci", exerciser.dev.name, "--buffer-size-kb", "4", "-o", "{rec}", "--",
        "sh", "-c", steps(f"cloop {BLIT}")], **edu(exerciser))
