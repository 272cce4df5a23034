"""Where is this course running, and does everything it uses work here? A check that never fails.

    >>> import dpteach.course.env
    >>> dpteach.course.env.check()          # a table in Jupyter, plain text anywhere else

Each item says OK, missing or a warning, what was found, and one sentence on how to fix it.
Nothing here raises: a probe that breaks becomes an item that says so, because chapter 00 and
``python -m dpteach`` must always print a report, on a bare GPU box as on Colab.
"""

from __future__ import annotations

import html
import importlib
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

__all__ = ["Item", "Report", "check", "where"]

OK, MISSING, WARN, INFO = "OK", "missing", "warning", "info"


@dataclass
class Item:
    """One line of the report: what was checked, its status, what was found, how to fix it."""

    name: str
    status: str  # OK, missing, warning or info
    found: str
    fix: str = ""  # one sentence, empty when there is nothing to do

    @property
    def ok(self) -> bool:
        return self.status in (OK, INFO)


@dataclass
class Report:
    """The environment check: one ``Item`` per thing the course uses, and where it runs."""

    place: str  # "Colab", "Binder" or "local"
    items: list[Item] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is missing (warnings and info do not count)."""
        return all(i.status != MISSING for i in self.items)

    def __getitem__(self, name: str) -> Item:
        for item in self.items:
            if item.name == name:
                return item
        raise KeyError(f"no item {name!r}; the report has {', '.join(i.name for i in self.items)}")

    def __str__(self) -> str:
        width = max(len(i.name) for i in self.items) if self.items else 0
        lines = [f"dpteach environment check (running on: {self.place})"]
        for i in self.items:
            lines.append(f"  {i.status:<8} {i.name:<{width}}  {i.found}")
            if i.fix:
                lines.append(f"  {'':<8} {'':<{width}}  -> {i.fix}")
        lines.append("All set." if self.ok else "Some parts are missing; each line above says how to fix it.")
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        """The notebook's form: a row for each item that is not OK, then the OK ones named in one line
        (the plain text, for a terminal, keeps every row)."""
        colour = {OK: "#1a7f37", MISSING: "#cf222e", WARN: "#9a6700", INFO: "#0969da"}
        shown = [i for i in self.items if i.status != OK]
        rows = "".join(
            f"<tr><td style='color:{colour.get(i.status, '#000')};font-weight:bold'>{html.escape(i.status)}</td>"
            f"<td>{html.escape(i.name)}</td><td>{html.escape(i.found)}</td>"
            f"<td>{html.escape(i.fix)}</td></tr>"
            for i in shown
        )
        table = (
            f"<table><tr><th>status</th><th>item</th><th>found</th><th>how to fix</th></tr>{rows}</table>"
            if shown
            else ""
        )
        fine = [i.name for i in self.items if i.status == OK]
        oks = (
            f"<p><b>OK</b> ({len(fine)} of {len(self.items)}): {html.escape(', '.join(fine))}.</p>"
            if fine
            else ""
        )
        verdict = "All set." if self.ok else "Some parts are missing; each row says how to fix it."
        return (
            f"<p><b>dpteach environment check</b> (running on: {html.escape(self.place)})</p>"
            f"{table}{oks}<p>{verdict}</p>"
        )


def where() -> str:
    """'Colab', 'Binder' or 'local'."""
    if "google.colab" in sys.modules:  # the Colab kernel imports it at start-up
        return "Colab"
    if os.environ.get("BINDER_SERVICE_HOST") or os.environ.get("BINDER_REPO_URL"):
        return "Binder"
    return "local"


# --------------------------------------------------------------------------------------------
# The probes: each returns an Item and may raise; check() turns a raise into a warning item
# --------------------------------------------------------------------------------------------


def _version(module) -> str:
    return str(getattr(module, "__version__", "?"))


def _python(place: str) -> Item:
    found = f"Python {platform.python_version()} at {sys.executable}"
    if sys.version_info < (3, 10):
        return Item("python", MISSING, found, "dpteach needs Python 3.10 or newer.")
    return Item("python", OK, found)


def _dpteach(place: str) -> Item:
    from .._course import RELEASE, REPOSITORY, VERSION

    folder = Path(__file__).resolve().parents[1]  # the dpteach package, not this wing
    site = any(part in ("site-packages", "dist-packages") for part in folder.parts)
    how = "installed" if site else "a source checkout (editable install or PYTHONPATH)"
    return Item("dpteach", OK, f"dpteach {VERSION} (release {RELEASE} of {REPOSITORY}), {how}: {folder}")


def _memory(place: str) -> Item:
    """Free memory, and the container's limit where there is one (Binder stops a kernel over 2 GB)."""
    gib = 1024**3
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        pass
    if available is None:
        try:
            import psutil

            available = psutil.virtual_memory().available
        except ImportError:
            return Item("memory", INFO, "free memory unknown on this system")
    limit = None
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            text = Path(limit_file).read_text().strip()
            if text != "max" and int(text) < 1 << 50:  # cgroup v1 writes a huge number for "no limit"
                limit = int(text)
                available = min(available, limit - int(Path(usage_file).read_text().strip()))
            break
        except (OSError, ValueError):
            continue
    found = f"{available / gib:.1f} GB free"
    if limit is not None:
        found += f" of a {limit / gib:.1f} GB limit for this container"
    if available < 0.75 * gib:
        return Item(
            "memory",
            WARN,
            found,
            "Shut down the kernels of notebooks you are not using "
            "(Kernel > Shut Down Kernel, or the Running panel) to free memory.",
        )
    return Item("memory", INFO, found)


def _compiler(place: str) -> Item:
    exe = shutil.which(os.environ.get("CXX", "cl" if sys.platform == "win32" else "c++"))
    if exe is None:
        fix = {
            "Binder": "Add cxx-compiler to environment.yml (conda-forge) and rebuild the Binder.",
            "Colab": "Run `!apt-get install -y g++` in a cell.",
        }.get(
            place,
            "Install a C++ compiler: `apt-get install g++`, `xcode-select --install` on macOS, "
            "or `conda install -c conda-forge cxx-compiler`.",
        )
        return Item("compiler", WARN, "no C++ compiler on PATH (chapter 10 skips its compiled cells)", fix)
    done = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
    first = (done.stdout or done.stderr).strip().splitlines()[:1]
    if done.returncode != 0:
        return Item("compiler", WARN, f"{exe} is there but `--version` failed", "Reinstall the C++ compiler.")
    return Item("compiler", OK, f"{first[0] if first else exe} at {exe} (chapter 10 compiles C++)")


def _ninja(place: str) -> Item:
    exe = shutil.which("ninja") or shutil.which("ninja", path=str(Path(sys.executable).parent))
    if exe is None:
        fix = (
            "Run `!pip install ninja` in a cell."
            if place == "Colab"
            else _install_hint(place, "ninja", "ninja")
        )
        return Item("ninja", WARN, "not found (chapter 10 builds its C++ with ninja)", fix)
    done = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        return Item(
            "ninja", WARN, f"{exe} is there but `--version` failed", "Reinstall it: `pip install ninja`."
        )
    return Item("ninja", OK, f"ninja {done.stdout.strip()} at {exe} (chapter 10's C++ build)")


def _torch(place: str) -> Item:
    try:
        import torch
    except ImportError:
        return Item(
            "torch",
            MISSING,
            "not installed",
            "Install PyTorch: see https://pytorch.org/get-started/locally/.",
        )
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
    return Item("torch", OK, f"torch {torch.__version__} ({build})")


def _devices(place: str) -> Item:
    import torch

    from .._devices import default_devices

    devices = default_devices()
    slots = ", ".join(str(d) for d in devices)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count >= 2:
        why = f"{count} GPUs found: one slot on each"
    elif count == 1:
        why = f"one GPU ({torch.cuda.get_device_name(0)}): two slots on it, so slot 1 gets its own copy"
    else:
        why = (
            "no GPU: two slots on the CPU, with the four moves and autograd graph of two GPUs; "
            "the slots take turns on one thread, so their step times are not two GPUs'"
        )
    found = f"default_devices() = [{slots}]; {why}"
    if count >= 2:
        return Item("devices", OK, found)
    fix = (
        "Optional: Runtime > Change runtime type > GPU gives one GPU."
        if place == "Colab"
        else "Optional: every chapter runs as is; chapter 08 shows real speed only on several GPUs."
    )
    return Item("devices", INFO, found, fix)


def _install_hint(place: str, pip: str, conda: str) -> str:
    if place == "Binder":
        return f"Add {conda} to environment.yml (conda-forge) and rebuild the Binder."
    if place == "Colab":
        return f"Run `!pip install {pip}` in a cell."
    return f"Run `pip install {pip}` (or `conda install -c conda-forge {conda}`)."


def _package(name: str, pip: str, conda: str, needed_for: str) -> Callable[[str], Item]:
    def probe(place: str) -> Item:
        try:
            module = importlib.import_module(name)
        except ImportError:
            return Item(name, MISSING, f"not installed ({needed_for})", _install_hint(place, pip, conda))
        return Item(name, OK, f"{name} {_version(module)} ({needed_for})")

    probe.__name__ = f"_{name}"
    return probe


def _dot(place: str) -> Item:
    exe = shutil.which("dot")
    if exe is None:
        fix = {
            "Colab": "Run `!apt-get install -y graphviz` in a cell.",
            "Binder": "Add graphviz to environment.yml (conda-forge) and rebuild the Binder.",
        }.get(
            place,
            "Install the Graphviz program: `apt-get install graphviz`, `brew install graphviz` "
            "or `conda install -c conda-forge graphviz`.",
        )
        return Item("dot", MISSING, "the Graphviz `dot` program is not on PATH (graphs print as text)", fix)
    try:  # draw a two-node graph, so "found" means "works"
        done = subprocess.run([exe, "-Tsvg"], input=b"digraph { a -> b }", capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as err:
        return Item("dot", WARN, f"{exe} is there but did not run: {err}", "Reinstall Graphviz.")
    if done.returncode != 0 or b"<svg" not in done.stdout:
        message = done.stderr.decode(errors="replace").strip().splitlines()[:1]
        return Item(
            "dot", WARN, f"{exe} failed to draw a test graph: {' '.join(message)}", "Reinstall Graphviz."
        )
    version = (
        subprocess.run([exe, "-V"], capture_output=True, timeout=10).stderr.decode(errors="replace").strip()
    )
    return Item("dot", OK, f"{version or exe} (draws autograd graphs)")


def _major(version: str) -> int | None:
    try:
        return int(version.split(".")[0])
    except ValueError:
        return None


def _widgets(place: str) -> Item:
    try:
        import ipywidgets
    except ImportError:
        return Item(
            "ipywidgets",
            MISSING,
            "not installed (sliders and buttons)",
            _install_hint(place, "ipywidgets", "ipywidgets"),
        )
    found = f"ipywidgets {ipywidgets.__version__} (sliders and buttons)"
    if place == "Colab":  # Colab draws core widgets itself, 7.x included; never upgrade them there
        return Item("ipywidgets", OK, found)
    try:
        from importlib.metadata import version

        lab = version("jupyterlab_widgets")
    except Exception:  # the frontend may live in another environment; nothing to compare
        return Item("ipywidgets", OK, found)
    kernel, frontend = _major(ipywidgets.__version__), _major(lab)
    # ipywidgets 8 pairs with jupyterlab_widgets 3, ipywidgets 7 with jupyterlab_widgets 1
    if (kernel, frontend) in ((8, 3), (7, 1)) or None in (kernel, frontend):
        return Item("ipywidgets", OK, f"{found}; JupyterLab side: jupyterlab_widgets {lab}")
    return Item(
        "ipywidgets",
        WARN,
        f"{found}, but jupyterlab_widgets {lab} is a different generation: widgets may show an error",
        "Install matching versions: `pip install 'ipywidgets>=8,<9' 'jupyterlab_widgets>=3'`.",
    )


def _kernel(place: str) -> Item:
    shell = None
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        pass
    if shell is None:
        return Item(
            "notebook", INFO, "plain Python, not a Jupyter kernel: plots and widgets show in notebooks only"
        )
    return Item("notebook", OK, f"running in {type(shell).__name__} ({place})")


PROBES: list[tuple[str, Callable[[str], Item]]] = [
    ("python", _python),
    ("dpteach", _dpteach),
    ("torch", _torch),
    ("devices", _devices),
    ("memory", _memory),
    ("dot", _dot),
    ("graphviz", _package("graphviz", "graphviz", "python-graphviz", "Python side of the drawings")),
    ("ipywidgets", _widgets),
    ("matplotlib", _package("matplotlib", "matplotlib", "matplotlib", "plots")),
    ("tqdm", _package("tqdm", "tqdm", "tqdm", "progress bars")),
    ("compiler", _compiler),
    ("ninja", _ninja),
    ("notebook", _kernel),
]


def _issues() -> str:
    from .._course import REPOSITORY

    return f"{REPOSITORY}/issues"


def check() -> Report:
    """Look at everything the course uses and say what is there; never raises."""
    try:
        place = where()
    except Exception:  # pragma: no cover - sys.modules and os.environ do not fail in practice
        place = "unknown"
    report = Report(place)
    for name, probe in PROBES:
        try:
            report.items.append(probe(place))
        except Exception as err:  # a broken probe is a finding, not a crash
            report.items.append(
                Item(
                    name,
                    WARN,
                    f"the check itself failed: {type(err).__name__}: {err}",
                    f"Report this, with the message, at {_issues()}.",
                )
            )
    return report
