"""Sentences about speed, computed from what a chapter just measured on the learner's machine.

The cost chapters (06, 09, 12) rest on counts and order and show timings only as figures with their
spread; what is left here serves the timing displays that still print a sentence beside their
medians (chapter 08's, and ``measure.scaling``'s band): a ``Comparison`` whose verdict has a margin,
so that noise between runs does not flip it:

    >>> print(Comparison("clone-then-.to", "to", 2.0e-3, 1.0e-3))
    clone-then-.to took 2.00x the time of to (2.000 ms against 1.000 ms): slower

``tests/test_claims.py`` checks the rule and that such sentences agree with the numbers beside them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MARGIN", "WIDE", "reading", "Comparison", "SpeedUp"]

MARGIN = 1.2  # a ratio of medians inside (1/MARGIN, MARGIN) is "about the same": noise, not a finding

SLOWER, FASTER, SAME = "slower", "faster", "about the same"
NOISY = "too noisy to tell"  # inside a margin so wide that "about the same" would claim too much
WIDE = 1.5  # a measured noise margin this wide or wider: rounds that disagree by half or more


def _ms(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.3f} ms"


def _noted(margin: float) -> str:
    """A margin other than ``MARGIN`` (a chapter's measured noise, when wider) is said in the sentence."""
    return "" if margin == MARGIN else f" (noise margin {margin:.2f}x)"


def reading(margin: float) -> str:
    """The line a cell prints above its verdicts: what "about the same" means under ``margin``."""
    said = f"the noise margin, {margin:.2f}x (the rounds' spread or claims.MARGIN, the larger)"
    if round(margin, 2) >= WIDE:
        return (
            f'So below, two medians closer than {said} read "{NOISY}": the rounds disagreed by half or '
            "more, so a ratio inside it cannot be told from 1."
        )
    return f'So below, "{SAME}" means closer than {said}.'


@dataclass(frozen=True)
class Comparison:
    """Two medians (seconds) and the verdict they support: ``first`` is slower, faster or about the same."""

    first: str
    second: str
    first_seconds: float
    second_seconds: float
    margin: float = MARGIN

    @property
    def ratio(self) -> float:
        """``first``'s time over ``second``'s: above 1, ``first`` took longer."""
        return self.first_seconds / self.second_seconds

    @property
    def verdict(self) -> str:
        # decided on the ratio as the sentence prints it (two decimals), so the words never contradict
        # the number beside them: a printed 1.20x against a 1.20x margin reads "slower" on every run
        ratio = round(self.ratio, 2)
        if ratio >= round(self.margin, 2):
            return SLOWER
        if ratio <= 1 / self.margin:
            return FASTER
        # inside a wide margin a ratio of 0.5 is not "the same": the rounds cannot tell it from 1
        return NOISY if round(self.margin, 2) >= WIDE else SAME

    def __str__(self) -> str:
        return (
            f"{self.first} took {self.ratio:.2f}x the time of {self.second} "
            f"({_ms(self.first_seconds)} against {_ms(self.second_seconds)}): {self.verdict}{_noted(self.margin)}"
        )


@dataclass(frozen=True)
class SpeedUp:
    """Whether a parallel step beat the plain one by more than the margin: the question DataParallel answers.

    Coarser than a ``Comparison`` on purpose: "slower" and "about the same" are both "no speed-up",
    so a step that costs about as much as the plain one does not flip the sentence from run to run.
    """

    parallel: str
    plain: str
    parallel_seconds: float
    plain_seconds: float
    margin: float = MARGIN

    @property
    def ratio(self) -> float:
        """Speed relative to the plain step: above 1, the parallel step was faster."""
        return self.plain_seconds / self.parallel_seconds

    @property
    def verdict(self) -> str:
        ratio, margin = round(self.ratio, 2), round(self.margin, 2)
        if ratio >= margin:
            return "a speed-up"
        # a ratio that would be a speed-up against claims.MARGIN, under a margin too wide to say so
        return NOISY if margin >= WIDE and ratio >= MARGIN else "no speed-up"

    def __str__(self) -> str:
        return (
            f"{self.parallel} ran at {self.ratio:.2f}x the speed of {self.plain} "
            f"({_ms(self.parallel_seconds)} against {_ms(self.plain_seconds)}): {self.verdict}{_noted(self.margin)}"
        )
