"""The serving process's collector settings (gateway/serving/heap.py), in a fresh interpreter:
they are process-wide, so the test process itself is left alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import gc
from gateway.serving.heap import YOUNG_THRESHOLD, settle_heap
loaded = [[i] for i in range(1000)]  # long-lived objects, as start-up loads keys
before = gc.get_threshold()
settle_heap()
after = gc.get_threshold()
print(before[0], after[0], after[1:] == before[1:], YOUNG_THRESHOLD)
print(gc.get_freeze_count() >= len(loaded), gc.is_tracked(loaded[0]))
"""


def test_settle_heap_freezes_what_is_loaded_and_raises_the_young_threshold() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    default, raised, older_kept, wanted = out[0].split()
    assert (default, raised, older_kept) == ("700", wanted, "True")
    assert out[1] == "True True"
