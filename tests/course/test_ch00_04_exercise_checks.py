"""The exercise checks of chapters 00 and 04 that have no cell of their own elsewhere:
``checks.mean_of_means``, ``checks.backward_moves``, ``checks.idle_slots`` and ``checks.moves_between_devices``
(00, exercises 1 to 4),
``checks.shallow_copy_line`` and ``checks.tied_weights`` (04, exercises 4 and 2). What is asserted is the slip found (``Verdict.problem``), that the hints climb
one rung per wrong try with the answer last, and that each chapter's check cell calls its check; the
truths come from torch's source and a live ``replicate``, never from a copied run.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import nbformat
import pytest
from torch import nn

from dpteach.course import checks

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
RIGHT_MOVES = {"gather": "c", "parallel_apply": "d", "replicate": "a", "scatter": "f"}
DECOYS = {"b", "e"}  # the letters of exercise 3 that fit no move under the default strategy


pytestmark = pytest.mark.usefixtures("fresh_checks")  # every test starts at hint 1


def _tagged(chapter: str, tag: str) -> str:
    cells = nbformat.read(NOTEBOOKS / chapter, as_version=4).cells
    (cell,) = [c for c in cells if tag in c.metadata.get("tags", [])]
    return cell.source


# ---------------------------------------------------------------- chapter 00, exercise 4


def test_mean_of_means_holds_on_equal_pieces_only():
    verdict = checks.mean_of_means(True, False)
    assert verdict.ok and "1/256 in a piece of 128" in verdict.message  # 2 slots: every row weighs 1/256
    assert "1/258 in a piece of 86 and 1/252 in a piece of 84" in verdict.message  # 3 slots: they differ


def test_mean_of_means_is_computed_not_assumed():
    # the truth is the live step: equal pieces give one device's gradients, unequal pieces do not
    (gathered_2, averaged_2, close_2), (gathered_3, averaged_3, close_3) = (
        checks._slot_means(s) for s in (2, 3)
    )
    assert close_2 and not close_3
    assert max(gathered_2, gathered_3, averaged_2) < 1e-6 < averaged_3  # float rounding, and far more


@pytest.mark.parametrize(
    "answer, problem, change",
    [
        ((True, True), "unequal pieces", "change `three_slots`"),
        ((False, False), "equal pieces", "change `two_slots`"),
        ((False, True), "both", "change `two_slots`"),
    ],
)
def test_mean_of_means_says_which_prediction_to_change_from_the_second_try(answer, problem, change):
    first, second = checks.mean_of_means(*answer), checks.mean_of_means(*answer)
    assert not first.ok and first.problem == problem
    # two True/False answers: naming the wrong one, or its measured gap, on the first try is the answer
    said = first.message.split("\nHint")[0]
    assert "two_slots" not in said and "three_slots" not in said and "differs" not in said
    assert "change the one that does not hold" in said  # still says what to change
    assert second.problem == problem and change in second.message


def test_mean_of_means_climbs_to_the_answer():
    tries = [checks.mean_of_means(True, True) for _ in range(3)]
    assert not any(t.ok for t in tries)
    assert "Hint 1 of 2" in tries[0].message and "Hint 2 of 2" in tries[1].message
    assert "The answer: two_slots = True, three_slots = False" in tries[2].message
    unset = checks.mean_of_means(..., True)
    assert "True or False" in unset.message and "Hint" not in checks.mean_of_means("yes", False).message


def test_chapter_00_exercise_4s_answer_quotes_the_measured_differences():
    (gathered_2, averaged_2, _), (gathered_3, averaged_3, _) = (checks._slot_means(s) for s in (2, 3))
    answer = _tagged("00_start_here.ipynb", "ex4-answer")
    assert f"up to {averaged_3:.1e}" in answer  # the 3-slot gap the check prints, to two digits
    rounding = float(re.search(r"2 slots stay below (\S+),", answer).group(1))
    assert max(gathered_2, averaged_2, gathered_3) < rounding < averaged_3  # float rounding only, on 2


def test_chapter_00_exercise_4_has_its_check_cell():
    source = _tagged("00_start_here.ipynb", "ex4-check")
    assert "checks.mean_of_means(two_slots, three_slots)" in source
    assert "two_slots = ..." in source and "three_slots = ..." in source


# ---------------------------------------------------------------- chapter 00, exercise 3


def test_backward_moves_accepts_the_worked_answer_and_shows_the_run():
    verdict = checks.backward_moves(RIGHT_MOVES)
    assert verdict.ok  # under 'clone' the model's .grad stays None, x.grad fills: said as a sentence
    assert "under 'clone' the model's .grad stays None while x.grad fills" in verdict.message


@pytest.mark.parametrize(
    "swap, problem",
    [
        ({"gather": RIGHT_MOVES["scatter"], "scatter": RIGHT_MOVES["gather"]}, "gather and scatter"),
        (
            {"replicate": RIGHT_MOVES["parallel_apply"], "parallel_apply": RIGHT_MOVES["replicate"]},
            "replicate and parallel_apply",
        ),
        ({"gather": RIGHT_MOVES["replicate"], "replicate": RIGHT_MOVES["gather"]}, "moves"),
    ],
)
def test_backward_moves_names_the_swap(swap, problem):
    verdict = checks.backward_moves({**RIGHT_MOVES, **swap})
    assert not verdict.ok and verdict.problem == problem and "Hint 1 of 2" in verdict.message


@pytest.mark.parametrize("one, other", [("gather", "scatter"), ("replicate", "parallel_apply")])
def test_backward_moves_names_a_swapped_pair_only_from_the_second_try(one, other):
    swapped = {**RIGHT_MOVES, one: RIGHT_MOVES[other], other: RIGHT_MOVES[one]}
    first, second = checks.backward_moves(swapped), checks.backward_moves(swapped)
    said = first.message.split("\nHint")[0]
    # the first try gets the idea and what to change; naming the pair would be the answer itself
    assert "swap" in said and not any(move in said for move in RIGHT_MOVES)
    assert f"you swapped {one} and {other}" in second.message and "Hint 2 of 2" in second.message


def test_backward_moves_climbs_to_the_answer_and_reads_as_a_sentence():
    wrong = {**RIGHT_MOVES, "gather": RIGHT_MOVES["replicate"], "replicate": RIGHT_MOVES["gather"]}
    tries = [checks.backward_moves(wrong) for _ in range(3)]
    assert [t.problem for t in tries] == ["moves"] * 3
    # the letter's own description, as a sentence ("is not the one that sums", not "does not sums")
    summing = checks.BACKWARD_OF_MOVES[RIGHT_MOVES["replicate"]]
    assert f"gather's backward is not the one that {summing}:" in tries[0].message
    assert "Hint 1 of 2" in tries[0].message and "Hint 2 of 2" in tries[1].message
    assert "The answer:" in tries[2].message
    assert f"'replicate': '{RIGHT_MOVES['replicate']}'" in tries[2].message


def test_backward_moves_asks_for_letters_and_costs_no_hint():
    assert "Give every move" in checks.backward_moves({m: ... for m in RIGHT_MOVES}).message
    assert "one letter" in checks.backward_moves({**RIGHT_MOVES, "gather": "z"}).message
    swapped = {**RIGHT_MOVES, "gather": RIGHT_MOVES["scatter"], "scatter": RIGHT_MOVES["gather"]}
    assert "Hint 1 of 2" in checks.backward_moves(swapped).message


def test_backward_moves_letters_follow_neither_order_of_the_moves():
    forward = [RIGHT_MOVES[m] for m in ("scatter", "replicate", "parallel_apply", "gather")]
    for order in (forward, forward[::-1]):  # backward runs the moves in reverse
        assert order != sorted(order), order  # a to d in either order would give the answer away


def test_backward_moves_offers_two_letters_that_fit_no_move():
    assert set(checks.BACKWARD_OF_MOVES) - set(RIGHT_MOVES.values()) == DECOYS
    assert "averages" in checks.BACKWARD_OF_MOVES["e"] and "no gradient" in checks.BACKWARD_OF_MOVES["b"]


@pytest.mark.parametrize("move", list(RIGHT_MOVES))
@pytest.mark.parametrize("decoy", sorted(DECOYS))
def test_backward_moves_rejects_a_decoy_and_says_why_it_does_not_fit(move, decoy):
    verdict = checks.backward_moves({**RIGHT_MOVES, move: decoy})
    assert not verdict.ok and verdict.problem == "decoy"
    said = verdict.message.split("\nHint")[0]
    assert f"Give {move} another letter" in said  # says what to change
    assert f"'{RIGHT_MOVES[move]}'" not in said and "sums" not in said  # and not the letter that fits


def test_backward_moves_tells_replicates_sum_from_an_average():
    said = checks.backward_moves({**RIGHT_MOVES, "replicate": "e"}).message
    assert "an average would divide" in said
    said = checks.backward_moves({**RIGHT_MOVES, "replicate": "b"}).message
    assert "BroadcastBackward" in said and "'clone', the bug" in said


def test_backward_moves_shows_the_sum_on_a_live_step():
    verdict = checks.backward_moves(RIGHT_MOVES)
    found = re.search(r"by (\S+): a sum .* would differ by (\S+)\)", verdict.message)
    summed, averaged = (float(v) for v in found.groups())
    assert summed < 1e-6 < averaged  # the model's .grad is one device's: summed, not averaged


def test_backward_moves_reads_a_move_in_any_case():
    capitalised = {m.capitalize(): letter.upper() for m, letter in RIGHT_MOVES.items()}
    assert checks.backward_moves(capitalised).ok  # "Replicate", as a learner may type it


@pytest.mark.parametrize("number", [1, 2, 3, 4])
def test_chapter_00_answers_come_after_their_checks(number):
    cells = nbformat.read(NOTEBOOKS / "00_start_here.ipynb", as_version=4).cells
    at = {tag: i for i, c in enumerate(cells) for tag in c.metadata.get("tags", [])}
    for check in ("ex1-idle", "ex1-pieces") if number == 1 else (f"ex{number}-check",):
        assert at[f"ex{number}-answer"] > at[check]  # the learner meets the check before the worked answer
    assert "<summary>Answer</summary>" in cells[at[f"ex{number}-answer"]].source


def test_chapter_00_exercise_3s_worked_answer_passes_its_check():
    answer = _tagged("00_start_here.ipynb", "ex3-answer")
    does = ast.literal_eval(answer.split("`does = ", 1)[1].split("`", 1)[0])
    assert checks.backward_moves(does).ok


def test_chapter_00_exercise_3_has_its_check_cell():
    source = _tagged("00_start_here.ipynb", "ex3-check")
    assert "checks.backward_moves(does)" in source and "left_out" not in source
    assert all(f'"{m}": ...' in source for m in RIGHT_MOVES)
    # the cell lists the check's letters, and no description names its move or its tensors' names
    for letter, does in checks.BACKWARD_OF_MOVES.items():
        assert f"#   {letter}: {does}\n" in source
        assert not any(word in does for word in (*RIGHT_MOVES, ".grad", "model", "slot"))


# ---------------------------------------------------------------- chapter 00, exercise 2

CROSSING = {"scatter", "replicate", "gather"}


def test_moves_between_devices_accepts_the_three_moves_in_any_order_as_the_chapter_spells_them():
    assert checks.moves_between_devices(CROSSING).ok
    assert checks.moves_between_devices(["gather", "'scatter'", " replicate"]).ok  # spaces and quotes aside
    assert checks.moves_between_devices(CROSSING, slots=3).ok  # more lanes, the same moves cross


def test_moves_between_devices_reads_the_truth_from_the_pictures_edges():
    from dpteach.course import story

    crossing = [
        (a, b) for a, b in story.four_moves_lanes(2) if a.endswith(" 1") != b.endswith(" 1")
    ]  # one end in lane 1
    assert {a if a in story.FOUR_MOVES else b for a, b in crossing} == CROSSING


@pytest.mark.parametrize(
    "moves, problem, says",
    [
        (CROSSING | {"parallel_apply"}, "parallel_apply", "never leave"),
        ({"scatter", "replicate"}, "missed", "add gather"),
        ({"gather"}, "missed", "add replicate, scatter"),
    ],
)
def test_moves_between_devices_says_what_to_change(moves, problem, says):
    verdict = checks.moves_between_devices(moves)
    assert not verdict.ok and verdict.problem == problem and says in verdict.message
    assert "Hint 1 of 2" in verdict.message


def test_moves_between_devices_asks_for_a_set_of_names_and_costs_no_hint():
    assert checks.moves_between_devices(...).message.startswith("Set `moves`")
    assert checks.moves_between_devices("scatter").message.startswith("Set `moves`")  # a set, not one string
    assert not checks._failures


@pytest.mark.parametrize(
    "moves, says",
    [
        ({"scatter", "broadcast"}, "not 'broadcast'"),  # replicate's tool, not a move
        ({"scater", "replicate", "gather"}, "not 'scater'"),
    ],
)
def test_moves_between_devices_rejects_a_name_that_is_no_move_with_a_hint(moves, says):
    verdict = checks.moves_between_devices(moves)
    assert not verdict.ok and verdict.problem == "not moves" and says in verdict.message
    assert "Hint 1 of 2" in verdict.message  # a wrong name is a wrong answer: it gets the first hint
    assert "autograd Functions" not in verdict.message  # no capital typed: no note on torch's Functions


@pytest.mark.parametrize("moves", [{"Scatter", "replicate", "gather"}, {"SCATTER", "Replicate", "Gather"}])
def test_moves_between_devices_reads_a_capitalised_right_answer_as_right(moves):
    for _ in range(3):  # a right answer with a capital is right on every try, never a failed one
        verdict = checks.moves_between_devices(moves)
        assert verdict.ok and "Correct!" in verdict.message
        assert (
            "torch's autograd Functions" in verdict.message
        )  # the one-line note on Scatter, Gather, Broadcast
        assert "torch/nn/parallel/_functions.py" in verdict.message
    assert not checks._failures


def test_moves_between_devices_a_capitalised_wrong_answer_gets_a_hint_and_the_note():
    verdict = checks.moves_between_devices({"Scatter", "Gather"})
    assert not verdict.ok and verdict.problem == "missed" and "add replicate" in verdict.message
    assert "Hint 1 of 2" in verdict.message and "autograd Functions" in verdict.message


def test_chapter_00_exercise_2_has_its_check_cell():
    source = _tagged("00_start_here.ipynb", "ex2-check")
    assert "checks.moves_between_devices(moves)" in source and "moves = ..." in source


# ---------------------------------------------------------------- chapter 04, exercise 4


SHARED: set[str] = set()  # of a default replica's three registry dicts, the original's own: none


def _source_lines():
    source = inspect.getsource(nn.Module._replicate_for_data_parallel)
    return [s.strip() for s in source.splitlines() if s.strip() and not s.strip().startswith("#")]


def test_shallow_copy_line_accepts_the_dict_copy_from_torchs_own_source():
    (line,) = [s for s in _source_lines() if "__dict__" in s]
    verdict = checks.shallow_copy_line("   " + line, SHARED)  # indentation as copied from the print
    assert verdict.ok and "`_parameters`, `_buffers` and `_modules` are its own" in verdict.message


@pytest.mark.parametrize(
    "key, problem",
    [
        ("__new__", "new"),
        ("_parameters", "parameters"),
        ("_modules", "buffers or modules"),
        ("_is_replica", "flag"),
    ],
)
def test_shallow_copy_line_says_what_each_other_line_does(key, problem):
    (line,) = [s for s in _source_lines() if key in s and "__dict__" not in s]
    verdict = checks.shallow_copy_line(line, SHARED)
    assert not verdict.ok and verdict.problem == problem


def test_shallow_copy_line_reads_a_line_with_or_without_its_trailing_comment():
    (line,) = [s for s in _source_lines() if "_is_replica" in s]
    bare = line.split("#")[0]  # the placeholder's own example leaves "# type: ignore[...]" off
    assert (
        checks.shallow_copy_line(bare, SHARED).problem
        == "flag"
        == checks.shallow_copy_line(line, SHARED).problem
    )


def test_shallow_copy_line_reads_a_line_whatever_its_spacing():
    (line,) = [s for s in _source_lines() if "__dict__" in s]
    assert checks.shallow_copy_line("".join(line.split()), SHARED).ok  # replica.__dict__=self.__dict__.copy()
    assert checks.shallow_copy_line(line.replace(" = ", "  =  "), SHARED).ok


def test_shallow_copy_line_refuses_a_line_not_in_the_source():
    verdict = checks.shallow_copy_line("replica.members = self.members", SHARED)
    assert (
        not verdict.ok
        and verdict.problem == "not a line"
        and "def _replicate_for_data_parallel" in verdict.message
    )


def test_shallow_copy_line_shows_the_source_only_after_a_right_prediction():
    source = "def _replicate_for_data_parallel"
    right = checks.shallow_copy_line(..., SHARED)
    assert not right.ok and "Your prediction is right" in right.message and "Now set `line`" in right.message
    assert source in right.message  # the source to take the line from, once the prediction is graded
    checks.reset()
    wrong = checks.shallow_copy_line(..., {"_buffers"})
    assert not wrong.ok and wrong.problem == "predicted" and source not in wrong.message


@pytest.mark.parametrize(
    "predicted, says",
    [
        ({"_buffers"}, "`_buffers` is replaced by a copy of its own"),
        ({"_parameters"}, "`_parameters` is replaced by a new, empty dict"),
        ({"_buffers", "_modules"}, "`_modules` is replaced by a copy of its own"),
    ],
)
def test_shallow_copy_line_refuses_a_wrong_prediction_even_with_the_right_line(predicted, says):
    (line,) = [s for s in _source_lines() if "__dict__" in s]
    checks.reset()
    verdict = checks.shallow_copy_line(line, predicted)
    change = verdict.message.split("Hint")[0]
    assert (
        not verdict.ok
        and verdict.problem == "predicted"
        and says in change
        and "Change `predicted`" in change
    )
    assert "Hint 1 of 2" in verdict.message


def test_shallow_copy_line_climbs_separate_ladders_for_the_prediction_and_the_line():
    (new,) = [s for s in _source_lines() if "__new__" in s]
    checks.reset()
    checks.shallow_copy_line(new, {"_buffers"})  # a wrong prediction: its hint 1
    verdict = checks.shallow_copy_line(new, SHARED)  # now a wrong line: the line's own hint 1
    assert verdict.problem == "new" and "Hint 1 of 2" in verdict.message


def test_shallow_copy_line_asks_for_a_prediction_first_at_no_cost():
    (line,) = [s for s in _source_lines() if "__dict__" in s]
    assert checks.shallow_copy_line(line, ...).message.startswith("Set `predicted`")
    assert "set of names" in checks.shallow_copy_line(line, "members").message  # a string is not a set
    assert (
        "set of names" in checks.shallow_copy_line(line, {"weight"}).message
    )  # a name it does not ask about
    assert checks.shallow_copy_line(line, list(SHARED)).ok  # a list is read as the set it holds


def test_shallow_copy_line_asks_only_what_the_chapter_has_not_printed():
    """The trap cell prints that slot 1's `members` is the original's: the prediction is about the three dicts."""
    (line,) = [s for s in _source_lines() if "__dict__" in s]
    told = checks.shallow_copy_line(line, {"members"})
    assert not told.ok and "`members` is settled" in told.message and "Hint" not in told.message
    empty = checks.shallow_copy_line(line, {})  # {} is an empty dict, not the empty set
    assert not empty.ok and "write set()" in empty.message and "Hint" not in empty.message
    cell = _tagged("04_the_python_way.ipynb", "ex4-check")
    assert '"members"' not in cell.split("checks.")[0]  # the stub's names are the registry's three


def test_chapter_04_hints_say_that_a_new_kind_of_slip_starts_again():
    (new,) = [s for s in _source_lines() if "__new__" in s]
    (flag,) = [s for s in _source_lines() if "_is_replica" in s]
    first = checks.shallow_copy_line(new, SHARED)
    other = checks.shallow_copy_line(flag, SHARED)  # another slip: hint 1 again, as the message says
    assert "Hint 1 of 2" in first.message and "Hint 1 of 2" in other.message
    assert "each wrong try of the same kind brings the next step" in other.message


# ---------------------------------------------------------------- chapter 04, exercise 2


def test_tied_weights_accepts_three_tensors_one_shared_copy():
    verdict = checks.tied_weights(3, True)
    assert verdict.ok and "param_indices" in verdict.message


@pytest.mark.parametrize(
    "count, problem",
    [(4, "tie counted twice"), (2, "biases"), (6, "all slots"), (8, "all slots"), (5, "count")],
)
def test_tied_weights_names_the_counting_slip(count, problem):
    verdict = checks.tied_weights(count, True)
    assert not verdict.ok and verdict.problem == problem


def test_tied_weights_says_the_copies_are_one_tensor():
    verdict = checks.tied_weights(3, False)
    assert not verdict.ok and verdict.problem == "untied"
    change, hint = verdict.message.split("Hint 1 of 2: ")
    assert "is True" not in change  # the change keeps the answer back
    assert "copy" in hint and "parameters()" not in hint  # a hint about the copy, not about counting
    assert "param_indices" in checks.tied_weights(3, False).message.split("Hint 2 of 2: ")[1]
    assert "True or False" in checks.tied_weights(3, "yes").message


@pytest.mark.parametrize(
    "tag, call",
    [
        ("ex1-check", "checks.broadcast_layout(index, shared"),
        ("ex2-check", "checks.tied_weights(tensors_per_slot, same_copy"),
        ("ex3-check", "checks.replicatable_scale("),
        ("ex4-check", "checks.shallow_copy_line(line, predicted)"),
        ("ex5-check", "checks.kept_handle(raises, forward, TwoHeads)"),
    ],
)
def test_chapter_04_exercise_cells_call_their_checks(tag, call):
    assert call in _tagged("04_the_python_way.ipynb", tag)


# ---------------------------------------------------------------- chapter 00, exercise 1


def test_idle_slots_are_the_counts_torch_chunk_leaves_a_slot_without_rows():
    assert checks.idle_slots({5, 7, 8}, rows=12).ok
    assert checks.idle_slots([5, 7, 8.0], rows=12).ok  # a list, or a float that is a whole number
    extra = checks.idle_slots({5, 6, 7, 8}, rows=12)
    assert not extra.ok and extra.problem == "extra" and "with 6 slots every slot gets rows" in extra.message
    missed = checks.idle_slots({5}, rows=12)
    assert missed.problem == "missed" and "2 more slot counts" in missed.message
    assert "7" not in missed.message.split("Hint")[0]  # says how many were missed, not which
    assert checks.idle_slots({6}, rows=12).problem == "extra and missed"


def test_idle_slots_tells_chunk_from_the_divisor_rule_on_10_rows():
    assert checks.idle_slots({6, 7, 8}, rows=10).ok
    wrong = checks.idle_slots({3, 4, 6, 7, 8}, rows=10)  # "a count that does not divide 10 leaves one idle"
    assert (
        not wrong.ok
        and wrong.problem == "extra"
        and "with 3 or 4 slots every slot gets rows" in wrong.message
    )


def test_idle_slots_climbs_to_the_answer_and_asks_for_counts():
    tries = [checks.idle_slots(set(), rows=12) for _ in range(3)]
    assert "Hint 1 of 2" in tries[0].message and "Hint 2 of 2" in tries[1].message
    assert "The answer: idle = {5, 7, 8}" in tries[2].message
    checks.reset()
    for wrong_kind in (..., "5, 7", {5.5}, {0, 5}):
        verdict = checks.idle_slots(wrong_kind, rows=12)
        assert not verdict.ok and "Hint" not in verdict.message  # costs no hint
    assert not checks._failures


def test_pieces_says_how_many_pieces_torch_chunk_makes():
    verdict = checks.pieces([3, 3, 3, 3, 2, 2], rows=16, slots=6)  # six pieces, sizes wrong
    assert not verdict.ok and "6 pieces is right" in verdict.message
    verdict = checks.pieces([4, 4, 4, 4], rows=16, slots=6)  # four pieces: torch.chunk makes six
    assert "into 6 pieces, not 4" in verdict.message
