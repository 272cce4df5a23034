"""Seconds each code cell of an executed notebook took (from nbclient's timing metadata)."""

import sys
from datetime import datetime

import nbformat

for path in sys.argv[1:]:
    nb = nbformat.read(path, as_version=4)
    print(path)
    for cell in nb.cells:
        meta = cell.metadata.get("execution", {})
        start, end = meta.get("iopub.execute_input"), meta.get("shell.execute_reply")
        if cell.cell_type == "code" and start and end:
            seconds = (
                datetime.fromisoformat(end.replace("Z", "+00:00"))
                - datetime.fromisoformat(start.replace("Z", "+00:00"))
            ).total_seconds()
            print(f"  {seconds:6.2f} s  {cell.source.splitlines()[0][:70] if cell.source else ''}")
