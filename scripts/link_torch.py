"""Put this environment's torch into another virtual environment by hard links, without pip.

    python scripts/link_torch.py DEST_PYTHON

Installing torch into a fresh venv is mostly unpacking 2,000-odd files (about 45 s on a 2-core machine);
linking the installed ones takes about a second. The test suite uses it where a fresh venv only needs
*a* torch to be there: the wheel check (scripts/check_wheel.sh) and the Colab-like environment
(scripts/colab_like.sh), when ``DPTEACH_TORCH_FROM`` names the python whose torch to link. torch and
every distribution it requires are linked with their ``.dist-info``, so pip in the new venv sees them
installed. Console scripts (``torchrun``) are not linked: their first line names the old interpreter.
A file that cannot be hard-linked (another file system) is copied.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path


def requirements(name: str, seen: dict[str, metadata.Distribution]) -> None:
    """``seen`` gains the distribution ``name`` and, recursively, what it requires in this environment."""
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        return
    dist = metadata.distribution(name)
    seen[key] = dist
    for req in dist.requires or []:
        if "extra ==" in req:  # an optional extra, not needed to import torch
            continue
        marker = req.split(";", 1)[1] if ";" in req else ""
        if marker and not _marker_holds(marker):
            continue
        dep = re.match(r"[A-Za-z0-9_.\-]+", req).group(0)
        try:
            requirements(dep, seen)
        except metadata.PackageNotFoundError:  # not needed on this platform or Python
            pass


def _marker_holds(marker: str) -> bool:
    from packaging.markers import Marker

    return Marker(marker.strip()).evaluate()


def link(dest_python: str) -> int:
    dest = Path(
        subprocess.run(
            [dest_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    seen: dict[str, metadata.Distribution] = {}
    requirements("torch", seen)
    count = 0
    for dist in seen.values():
        for file in dist.files or []:
            if file.parts[0] == "..":  # console scripts and data outside site-packages
                continue
            source = Path(dist.locate_file(file))
            if not source.is_file():
                continue
            target = dest / file
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                target.unlink()
            try:
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)
            count += 1
    names = ", ".join(f"{d.metadata['Name']} {d.version}" for d in seen.values())
    print(f"link_torch: {count} files of {names} into {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(link(sys.argv[1]))
