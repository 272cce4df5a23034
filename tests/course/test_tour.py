"""``python -m dpteach`` tells the bug and the fix in a terminal."""

import subprocess
import sys


def test_tour_shows_the_bug_and_the_fix():
    out = subprocess.run([sys.executable, "-m", "dpteach"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "environment check" in text and "torch" in text and "dot" in text and "ipywidgets" in text
    assert "BUG  clone" in text and "original .grad is None" in text  # the bug, measured
    assert "ok   rewire" in text and "ok   broadcast" in text  # the two fixes match one device
    assert text.count("equal to one device's") == 2
