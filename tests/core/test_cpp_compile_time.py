"""The cold compile's range is one constant (dpteach.cpp._build), which load() prints and the docs quote;
chapter 10 quotes no other range."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import torch.utils.cpp_extension

from dpteach.cpp import _build

CHAPTER = Path(__file__).resolve().parents[2] / "notebooks" / "10_the_cpp_original.ipynb"
DOCS = Path(__file__).resolve().parents[2] / "docs"


class Stopped(Exception):
    pass


def test_one_range_in_prose_and_message(tmp_path, monkeypatch, capsys):
    low, high = _build.EXPECTED_SECONDS
    assert 0 < low < high
    said = f"about {low} to {high} s"
    prose = " ".join(
        " ".join(c.source.split()) for c in nbformat.read(CHAPTER, 4).cells if c.cell_type == "markdown"
    )
    ranges = set(re.findall(r"(\d+) to (\d+) s\b", prose))
    assert ranges <= {(str(low), str(high))}, ranges  # the chapter quotes no range but this one ...
    for doc in ("teaching.md", "library.md"):
        assert f"{low} to {high} s" in " ".join((DOCS / doc).read_text().split()), (
            doc
        )  # ... the docs quote it ...

    def no_compiler(*args, **kwargs):
        raise Stopped

    monkeypatch.setenv("DPTEACH_CPP_CACHE", str(tmp_path))  # an empty cache: a cold build
    monkeypatch.setattr(torch.utils.cpp_extension, "load_inline", no_compiler)
    with pytest.raises(Stopped):
        _build.build(progress=True)
    assert said in capsys.readouterr().out  # ... that a cold load() prints
