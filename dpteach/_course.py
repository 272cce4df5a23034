"""Facts about the course that the notebooks, the README and the tests must agree on.

One place for where the course lives and which release it is:

* ``REPOSITORY``: the course's home. Moving it is a one-line change here, then
  ``scripts/sync_course.py`` (``make sync``, outside the wheel) rewrites what is derived from it (the README's badges and
  chapter table links, every chapter's set-up cell and link line, pyproject's URLs); ``tests/course/test_course_links.py`` fails until
  that is done.
* ``VERSION``: the package version. ``pyproject.toml`` reads it (``dynamic = ["version"]``), and
  ``dpteach.__version__`` is this string. ``RELEASE`` is its git tag, which the set-up cell installs
  and the Colab and Binder links open.

This module imports nothing but the standard library, so setuptools can read ``VERSION`` statically.
"""

from __future__ import annotations

from pathlib import Path

REPOSITORY = "https://github.com/dpteach/dpteach"  # the course's home: change it here only
VERSION = "0.1.0"
RELEASE = f"v{VERSION}"

_OWNER_REPO = REPOSITORY.removeprefix("https://github.com/").strip("/")

# Chapters that are worth opening on a GPU runtime: their notebooks ask Colab for one.
GPU_CHAPTERS = ("06_the_cost_of_copies", "08_real_gpus", "09_beyond_one_process")

COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
BINDER_BADGE = "https://mybinder.org/badge_logo.svg"
LINKS_CELL_ID = "open-links"  # the id of the markdown cell at the top of every notebook


def colab_url(notebook: str) -> str:
    """Open ``notebook`` (a path such as ``notebooks/01_the_bug.ipynb``) in Colab, at the release tag."""
    return f"https://colab.research.google.com/github/{_OWNER_REPO}/blob/{RELEASE}/{notebook}"


def binder_url(notebook: str) -> str:
    """Open ``notebook`` in JupyterLab on mybinder.org, at the release tag."""
    return f"https://mybinder.org/v2/gh/{_OWNER_REPO}/{RELEASE}?urlpath=lab/tree/{notebook}"


def badges(notebook: str) -> str:
    """The markdown line of launch badges for one notebook (README and the top of each notebook)."""
    return (
        f"[![Open In Colab]({COLAB_BADGE})]({colab_url(notebook)}) "
        f"[![Binder]({BINDER_BADGE})]({binder_url(notebook)})"
    )


# Chapters from 05 on build on the words of the chapters before them. Their first cell carries a
# collapsed recap of those words under the badges, so a learner who opens one chapter alone (from a
# link, on Colab) can look them up; the book keeps it. Each line is (the chapter it recaps, the line).
RECAP_FROM = 5
RECAP_LINES = (
    (
        0,
        "A **slot** is one entry in the device list, where one replica runs; two CPU slots stand in for two GPUs ([00](00_start_here.ipynb)).",
    ),
    (
        1,
        "The **course model** is `Linear(2, 16) → Tanh → Linear(16, 1)`, fitted to 256 points ([01](01_the_bug.ipynb)).",
    ),
    (
        2,
        "Backward follows **gradient edges**; `AccumulateGrad` stores a leaf's `.grad` ([02](02_reading_autograd_graphs.ipynb)).",
    ),
    (
        4,
        """`"rewire"` joins each replica parameter to the model through a `ReduceAdd` node, PR #20910's fix
  ([03](03_rewiring_gradient_edges.ipynb)); `"broadcast"`, the default, does it through `Broadcast`'s backward, as
  torch's `replicate.py` does ([04](04_the_python_way.ipynb)).""",
    ),
    (
        5,
        """BatchNorm updates its running statistics **in place**, in each replica's forward. Where a replica's
  buffers are the model's own tensors, that update reaches the model ([05](05_buffers_and_batchnorm.ipynb)).""",
    ),
    (
        6,
        """`dpteach.comm.traffic()` records every copy dpteach makes inside its block, with its bytes and the
  operation that made it ([06](06_the_cost_of_copies.ipynb)).""",
    ),
    (
        7,
        """**Double backward** differentiates a gradient taken with `create_graph=True`: it walks what the first
  backward recorded, so every node on that path must record something differentiable. `Broadcast`'s backward
  does; the `ReduceAdd` of `"rewire"` refuses a gradient that requires grad ([07](07_double_backward.ipynb)).""",
    ),
    (
        8,
        """The **cost model** (`dpteach.measure.costmodel`) predicts a step's time on a named GPU from
  FLOPs and bytes; nothing in it is timed ([08](08_real_gpus.ipynb)).""",
    ),
    (
        9,
        """**DDP** runs a process per replica and averages the gradients by an all-reduce
  ([09](09_beyond_one_process.ipynb)).""",
    ),
    (
        10,
        """libtorch's C++ `data_parallel` made its replicas with `Module::clone()`, whose parameters are fresh
  leaves; PR #20910's C++ `ReduceAdd` joins them to the original and, like Python's, refuses a gradient
  that requires grad ([10](10_the_cpp_original.ipynb)).""",
    ),
)


def recap(number: int) -> str:
    """The collapsed recap for chapter ``number``: one line for each chapter before it that has one."""
    last = min(number - 1, max(chapter for chapter, _ in RECAP_LINES))
    lines = "\n".join(f"- {line}" for chapter, line in RECAP_LINES if chapter <= last)
    return f"<details><summary>Recap from chapters 00–{last:02d}</summary>\n\n{lines}\n</details>"


def link_cell(notebook: str) -> str:
    """The first cell of ``notebook``: its launch badges, then, from chapter ``RECAP_FROM`` on, the recap."""
    name = notebook.rsplit("/", 1)[-1]
    number = int(name[:2]) if name[:2].isdigit() else -1
    chapter = notebook.count("/") == 1 and 0 <= number <= 12  # notebooks/NN_*.ipynb, not solutions/
    return badges(notebook) + (f"\n\n{recap(number)}" if chapter and number >= RECAP_FROM else "")


# The first code cell of every chapter, verbatim (tests/course/test_notebooks.py checks it). It must work
# before dpteach is installed, so it is self-contained. On Colab it streams pip's output into the
# notebook (Colab hides a subprocess's own output) and, when pip fails, says so in one sentence.
SETUP_CELL = f'''\
# Set-up: on Colab, install dpteach {VERSION} (and ninja, for chapter 10) and turn on widgets;
# anywhere else (JupyterLab, Binder, a laptop) this cell does nothing.
import sys, subprocess
if "google.colab" in sys.modules:
    print("Installing dpteach {VERSION} from {REPOSITORY} ...", flush=True)
    pip = subprocess.Popen([sys.executable, "-m", "pip", "install", "--progress-bar", "off", "ninja",
                            "dpteach @ git+{REPOSITORY}@{RELEASE}"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in pip.stdout:
        print(line, end="", flush=True)
    if pip.wait() != 0:
        raise RuntimeError("pip could not install dpteach (its messages are above): check that this "
                           "runtime is online and that {REPOSITORY} has the tag "
                           "{RELEASE}, then run this cell again.")
    from google.colab import output
    output.enable_custom_widget_manager()
    print("dpteach {VERSION} is installed.")'''


def chapter_notebooks(root: Path) -> list[Path]:
    """Every notebook of the course (chapters and solutions), sorted."""
    found = (root / "notebooks").rglob("*.ipynb")
    return sorted(
        p for p in found if ".ipynb_checkpoints" not in p.parts
    )  # JupyterLab's copies are not the course
