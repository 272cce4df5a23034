"""Rewrite everything derived from dpteach/_course.py (REPOSITORY, VERSION): the README's badges and
launch links, every notebook's link cell, set-up cell and GPU metadata, pyproject's URLs.

    python scripts/sync_course.py [ROOT]      (make sync)

tests/test_course_links.py fails until this has been run after a change to dpteach/_course.py.
"""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Load _course.py by path: it needs only the standard library (and nbformat), not torch or an install.
spec = importlib.util.spec_from_file_location("_course", ROOT / "dpteach" / "_course.py")
course = importlib.util.module_from_spec(spec)
spec.loader.exec_module(course)

if __name__ == "__main__":
    sys.exit(course.main(sys.argv[1:] or [str(ROOT)]))
