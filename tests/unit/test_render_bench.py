"""tests/bench/render_bench.py: the rendering benchmark measures what the tracer does."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

from mmiotrace_ng.format.render import Renderer
from mmiotrace_ng.tracer import session

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from render_bench import bench_render  # noqa: E402


def test_bench_render_runs() -> None:
    assert inspect.signature(bench_render).parameters["batch"].default == session.BATCH
    assert bench_render(2000, repeat=1) > 0
    assert bench_render(2000, repeat=1, batch=300) > 0
    assert bench_render(2000, compat=True, show_pc=True, repeat=1) > 0


def test_bench_render_checks_what_it_rendered(monkeypatch) -> None:
    """The benchmark counts the lines it rendered: a renderer that drops one
    record makes it fail rather than report a rate."""
    real = Renderer.feed_ring

    def drop_one(self, data, batch):
        text, used = real(self, data, batch)
        return text.split("\n", 1)[1], used

    monkeypatch.setattr(Renderer, "feed_ring", drop_one)
    with pytest.raises(RuntimeError, match="wrong output"):
        bench_render(2000, repeat=1)
