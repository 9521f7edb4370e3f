"""A report's plots (analysis/plots.py): drawn half in a forked child where that is safe, every
one of them there in the end, whatever the child did; drawn in this process alone while another
thread runs (a fork would copy only this one, and another's locks with it)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from hpctrain.analysis import plots


def _plot(name: str, parent: int, fail_in_child: bool):
    def draw(a: object, path: Path) -> Path:
        if fail_in_child and os.getpid() != parent:
            raise RuntimeError("the child fails")
        path.write_text(f"{name} drawn by {'parent' if os.getpid() == parent else 'child'}\n")
        return path

    return draw


@pytest.mark.parametrize("fail_in_child", [False, True])
def test_every_plot_is_drawn_whatever_the_child_does(tmp_path: Path, fail_in_child: bool) -> None:
    forks = len(os.sched_getaffinity(0)) >= 2 and threading.active_count() == 1
    me = os.getpid()
    jobs = [(tmp_path / f"p{k}.png", _plot(f"p{k}", me, fail_in_child)) for k in range(5)]
    plots.draw_all(None, jobs)  # these plots read no analysis
    said = [p.read_text() for p, _ in jobs]
    assert all(f"p{k} drawn" in said[k] for k in range(5))
    by_child = [k for k in range(5) if "child" in said[k]]
    assert by_child == ([0, 2, 4] if forks and not fail_in_child else []), (
        said
    )  # a failed child's: redrawn here


def test_with_another_thread_running_every_plot_is_drawn_here(tmp_path: Path) -> None:
    me, stop = os.getpid(), threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        jobs = [(tmp_path / f"p{k}.png", _plot(f"p{k}", me, False)) for k in range(3)]
        plots.draw_all(None, jobs)
    finally:
        stop.set()
        other.join()
    assert all("parent" in p.read_text() for p, _ in jobs)
