"""Chapter 10 quotes the cold compile's range from the one constant load() prints (dpteach.cpp._build)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
import torch.utils.cpp_extension

from dpteach.cpp import _build

CHAPTER = Path(__file__).resolve().parents[2] / "notebooks" / "10_the_cpp_original.ipynb"


class Stopped(Exception):
    pass


def test_one_range_in_prose_and_message(tmp_path, monkeypatch, capsys):
    low, high = _build.EXPECTED_SECONDS
    assert 0 < low < high
    said = f"about {low} to {high} s"
    prose = " ".join(
        " ".join(c.source.split()) for c in nbformat.read(CHAPTER, 4).cells if c.cell_type == "markdown"
    )
    assert said in prose  # the chapter quotes the range ...

    def no_compiler(*args, **kwargs):
        raise Stopped

    monkeypatch.setenv("DPTEACH_CPP_CACHE", str(tmp_path))  # an empty cache: a cold build
    monkeypatch.setattr(torch.utils.cpp_extension, "load_inline", no_compiler)
    with pytest.raises(Stopped):
        _build.build(progress=True)
    assert said in capsys.readouterr().out  # ... that a cold load() prints
