"""``python -m dpteach``: a short terminal tour for someone with no notebook open, and ``reset``.

With no arguments: versions and devices, whether ``dot`` and ipywidgets are there, then the bug and
the fix in a few lines: one backward pass of the course model under each strategy, against one device.
``python -m dpteach reset 03`` (or ``--all``) puts chapters back to the course's version
(dpteach/_reset.py); ``--help`` prints the usage.
"""

from __future__ import annotations

import sys


def tour(out=sys.stdout) -> int:
    from ._course import VERSION as __version__
    from ._devices import default_devices
    from .course import story
    from .course.env import check

    def say(line: str = "") -> None:
        print(line, file=out)

    say(
        f'dpteach {__version__}: data parallelism in PyTorch, taught through PR #20910 ("Fix C++ data parallel")'
    )
    say()
    say(str(check()))
    devices = default_devices()
    say()
    say(
        f"The bug and the fix: one backward pass of Linear(2,16)-Tanh-Linear(16,1) over {', '.join(map(str, devices))}"
    )
    mark = {True: "ok  ", False: "BUG "}
    for strategy, what in (
        ("clone", "C++ before the fix: Module::clone(), issue #19540"),
        ("rewire", "PR #20910: one ReduceAdd node per parameter joins its replicas"),
        ("broadcast", "Python's replicate.py: Broadcast / ReduceAddCoalesced"),
    ):
        report = story.one_step(strategy, devices)
        say(f"  {mark[report.matches]} {strategy:<9}  {what}")
        say(f"       {'':<9}  {report.summary()}")
    say()
    say("Next: open the course with `make lab` and start at notebooks/00_start_here.ipynb,")
    say("or `import dpteach` and use dpteach.DataParallel(model, ['cpu', 'cpu']) in your own notebook.")
    return 0


USAGE = """\
usage: python -m dpteach               a short tour: your versions and devices, the bug and the fix
       python -m dpteach reset 03      put chapter 03 back to the course's version (asks first)
       python -m dpteach reset --all   the same for every chapter (--yes: do not ask)
       python -m dpteach --help        this text"""


def main(argv: list[str] | None = None, out=sys.stdout) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        return tour(out)
    if args[0] in ("-h", "--help", "help"):
        print(USAGE, file=out)
        return 0
    if args[0] == "reset":
        from ._reset import reset

        return reset(args[1:], out=out)
    print(f"python -m dpteach: unknown command {args[0]!r}\n{USAGE}", file=out)
    return 2


if __name__ == "__main__":
    sys.exit(main())
