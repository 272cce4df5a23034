"""Sphinx configuration of the course book: `make book` (scripts/build_book.py) builds it.

The pages are the chapters' executed copies, the ones the test suite makes (tests/executed.py), staged
by scripts/build_book.py into artifacts/book-src/ next to index.md; myst-nb renders them as they are
(``nb_execution_mode = "off"``: a chapter never runs a second time for the book). sphinx-book-theme
gives the sidebar, the in-page contents, search (a local index: it works offline), dark mode, the
download button and the Colab and Binder launch buttons, at the release tag of dpteach/_course.py.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from dpteach import _course  # noqa: E402  (standard library only: no torch needed to build the book)

project = "dpteach"
author = "The dpteach authors"
release = version = _course.VERSION
html_title = "dpteach: data parallelism in PyTorch"

extensions = ["myst_nb"]
nb_execution_mode = "off"
nb_merge_streams = True  # one print() split into two stream outputs shows as one line, as in JupyterLab
# A graph output carries SVG and an HTML <img> of it; the SVG wins, so that the cell's
# mystnb.image.alt metadata becomes its alt text, as for a matplotlib PNG.
nb_mime_priority_overrides = [("html", "image/svg+xml", 25)]
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
# error outputs of cells that fail on purpose (raises-exception) are shown as they are, lexed or not
suppress_warnings = ["mystnb.unknown_mime_type", "misc.highlighting_failure"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

html_theme = "sphinx_book_theme"
html_theme_options = {
    "repository_url": _course.REPOSITORY,
    "repository_branch": _course.RELEASE,  # the launch buttons open the release the set-up cell installs
    "path_to_docs": "",  # a page's path in the book is its path in the repository (notebooks/...)
    "use_repository_button": True,
    "use_download_button": True,
    "launch_buttons": {
        "colab_url": "https://colab.research.google.com",
        "binderhub_url": "https://mybinder.org",
        "notebook_interface": "jupyterlab",
    },
    "show_toc_level": 2,
    "home_page_in_toc": True,
}
html_last_updated_fmt = None
html_copy_source = True  # the download button serves the page's .ipynb from _sources/
