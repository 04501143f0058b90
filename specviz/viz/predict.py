"""Predict-then-reveal: each lab's question, its choices, and which choice a run's own measurement makes right."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specviz.viz.strip import esc
from specviz.viz.style import span


@dataclass(frozen=True)
class Question:
    """One prediction a pupil makes before a run (its choices are what the measurement is judged against)."""

    key: str  # session key suffix, unique per page
    text: str  # the question, Markdown
    choices: tuple[str, ...]


@dataclass(frozen=True)
class Reveal:
    """The answer after the run: the right choice, the measurement behind it, and a line of why."""

    right: str  # one of the question's choices
    measured: str  # what this run measured, in words and numbers
    why: str = ""
    also: tuple[str, ...] = ()  # other choices within the run's noise of `right`: "about the same", each counts as right

    @property
    def rights(self) -> tuple[str, ...]:
        return (self.right, *self.also)


D1_WORSE = Question("worse", "If the helper guesses wrong, does the final answer get worse?",
                    ("Yes, it gets worse", "No, a wrong guess only costs a little time", "Not sure"))
RACE = Question("race", "How much faster will the helper make this run?",
                ("Slower than the big model alone", "About the same", "About twice as fast", "Three times or more"))
CHEAP = Question("cheap", "Checking 16 new tokens in one pass takes how long, compared with making 1 token?",
                 ("About as long (under 2×)", "A few times as long (2–8×)", "About 16 times as long (over 8×)"))
SECOND = Question("second", "The second time you run the same text with a helper that remembers, how much faster will it be "
                  "than the first time?", ("About as fast as the first time", "A little faster", "Much faster"))
SAME = Question("same", "With the helper, will the big model write the very same words as on its own?",
                ("Yes, word for word", "No, some words change", "Not sure"))
ROW_BITS = Question("row_bits", "One row computed alone, then the same row computed beside 4 or 15 other rows in one call: "
                    "will its results have the very same bits?",
                    ("Same bits in every kernel", "Same in specviz's kernels, not in all of torch's",
                     "Different bits in every kernel"))
PRECISION = Question("precision", "The same model with 4-bit and with 16-bit numbers: counted in each one's own one-token "
                     "steps, which checks 16 new tokens at once more cheaply?",
                     ("The 4-bit one", "The 16-bit one", "About the same"))
BUSY = Question("busy", "With 16 pupils sharing the big model, how much faster will the helper make it?",
                ("Still about twice as fast", "A bit faster", "About the same", "Slower than without the helper"))


def busy_choice(speedup: float) -> str:
    """The BUSY choice a measured speed-up at the largest batch falls in."""
    if speedup >= 1.6:
        return BUSY.choices[0]
    if speedup >= 1.1:
        return BUSY.choices[1]
    if speedup > 0.9:
        return BUSY.choices[2]
    return BUSY.choices[3]


def second_choice(first: float, second: float) -> str:
    """The SECOND choice that the ratio of two measured speed-ups (the second run's over the first's) falls in."""
    ratio = second / first
    if ratio < 1.15:
        return SECOND.choices[0]
    if ratio < 1.6:
        return SECOND.choices[1]
    return SECOND.choices[2]


def reveal_second(first: float, second: float, first_tpc: float | None, second_tpc: float | None) -> Reveal:
    """The second run against the first: both speed-ups, and the tokens each target pass kept."""
    calls = (f" Each pass of the big model kept {second_tpc:.1f} tokens (the first time: {first_tpc:.1f})."
             if first_tpc is not None and second_tpc is not None else "")
    return Reveal(second_choice(first, second), f"Measured: the first run was {first:.2f}× as fast as the big model "
                  f"alone, the second {second:.2f}×.{calls}",
                  "The second time the helper found the whole first run in its memory and proposed long stretches of it.")


def reveal_busy(batch: int, speedup: float, alone: float, asked: int = 16) -> Reveal:
    """BUSY's answer; a measurement that stopped before the `asked` batch (its time limit) says it answers for less."""
    short = (f" The measurement stopped before {asked} runs (its time limit), so this answers for {batch}, not {asked}."
             if batch < asked else "")
    return Reveal(busy_choice(speedup), f"Measured: with {batch} runs together the helper made it {speedup:.2f}× as fast "
                  f"(with one run: {alone:.2f}×).{short}")


def gamma_choice(gamma: int) -> str:
    """A γ as a choice, in words every level reads (a prediction made at D5 stays the same choice at D1)."""
    return f"{gamma} {'guess' if gamma == 1 else 'guesses'}"


def gamma_question(gammas: Sequence[int], level: str = "d2") -> Question:
    """How far to guess: which of the γ values about to be measured will be fastest?"""
    text = ("How many guesses per turn will be fastest here?" if level == "d1" else
            "Which number of guesses per round (γ) will be fastest here?")
    return Question("gamma", text, tuple(gamma_choice(g) for g in gammas))


def workload_question(titles: Sequence[str]) -> Question:
    """Where it helps: which workload will gain most?"""
    return Question("workload", "Which kind of text will the helper speed up most?", tuple(titles))


def reveal_worse(identical: bool | None, rejected: int) -> Reveal:
    """D1: a wrong guess never makes the answer worse; this run's own check says so when it was greedy."""
    if identical is None:
        measured = (f"In this run the big model threw away {rejected} wrong guesses; with random picking the two "
                    "texts differ by chance, but both follow the big model's own choices.")
    elif identical:
        measured = (f"In this run the big model threw away {rejected} wrong guesses, and the text with the helper "
                    "was word for word the same as the big model's alone.")
    else:
        measured = (f"In this run the big model threw away {rejected} wrong guesses. The two texts differ at one "
                    "near-tie, from how the computer adds numbers, not from a bad guess.")
    return Reveal(D1_WORSE.choices[1], measured)


def race_choice(speedup: float) -> str:
    """The RACE choice a measured speed-up falls in."""
    if speedup < 0.95:
        return RACE.choices[0]
    if speedup < 1.4:
        return RACE.choices[1]
    if speedup < 2.6:
        return RACE.choices[2]
    return RACE.choices[3]


def reveal_race(speedup: float) -> Reveal:
    return Reveal(race_choice(speedup), f"Measured on this run: {speedup:.2f}× as fast as the target alone.")


def cheap_choice(ratio16: float) -> str:
    """The CHEAP choice a measured 16-token pass (in one-token steps) falls in."""
    if ratio16 < 2.0:
        return CHEAP.choices[0]
    if ratio16 <= 8.0:
        return CHEAP.choices[1]
    return CHEAP.choices[2]


def reveal_cheap(ratio16: float, step_ms: float) -> Reveal:
    return Reveal(cheap_choice(ratio16), f"Measured here: one pass over 16 new tokens took {ratio16:.2f}× a one-token "
                  f"step ({step_ms:.0f} ms), not 16×.")


def _tie(names: Sequence[str], speedups: Sequence[float], margin: float, subject: str) -> str:
    """The measured sentence of a lead within the noise: who tied, their range, and the margin they fell within."""
    return (f"Measured: {_join(names)} {subject} about the same ({span(min(speedups), max(speedups), 2, '×')} as fast "
            f"as the target alone): closer than this run's noise ({margin:.0%}), so each of them counts as right.")


def _join(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def reveal_gamma(best_gamma: int, best_speedup: float, tied: Sequence[tuple[int, float]] = (), margin: float = 0.0
                 ) -> Reveal:
    """γ's answer; `tied`: the other γ within `margin` of the best (then every one of them counts as right)."""
    if tied:
        names = [gamma_choice(best_gamma), *(gamma_choice(g) for g, _ in tied)]
        return Reveal(names[0], _tie(names, [best_speedup, *(x for _, x in tied)], margin, "were"), also=tuple(names[1:]))
    return Reveal(gamma_choice(best_gamma), f"Measured: {gamma_choice(best_gamma)} per round was fastest, "
                  f"{best_speedup:.2f}× as fast as the big model alone.")


def reveal_workload(best_title: str, best_speedup: float, tied: Sequence[tuple[str, float]] = (),
                    margin: float = 0.0) -> Reveal:
    """The workload answer; `tied`: the others within `margin` of the best (each then counts as right)."""
    if tied:
        names = [best_title, *(t for t, _ in tied)]
        return Reveal(best_title, _tie(names, [best_speedup, *(x for _, x in tied)], margin, "gained"),
                      also=tuple(names[1:]))
    return Reveal(best_title, f"Measured: {best_title} gained most, {best_speedup:.2f}× as fast as the target alone.")


def verdict_html(choice: str | None, reveal: Reveal, question: str | None = None) -> str:
    """The answer box: the question it answers, whether the pupil's prediction was right, then the measurement (all
    escaped; the question's **bold** kept). An answer without its question read as a contradiction beside the run."""
    answer = f"about the same: {_join(reveal.rights)}" if reveal.also else reveal.right
    if choice is None:
        head = f"Answer: {answer}."
    elif choice in reveal.rights:
        head = f"You predicted “{choice}” — right!"
    else:
        head = f"You predicted “{choice}”; the answer is “{answer}”."
    why = f" {esc(reveal.why)}" if reveal.why else ""
    asked = f'<div class="sv-question">Question: {_bold(question)}</div>' if question else ""
    return f'<div class="sv-answer">{asked}<b>{esc(head)}</b> {esc(reveal.measured)}{why}</div>'


def _bold(text: str) -> str:
    """Escaped text with its Markdown **bold** as <b> (our own question texts use nothing else)."""
    parts = esc(text).split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))


def helper_question(preset_title: str, helper_titles: Sequence[str]) -> Question:
    """Which helper wins? One question per preset (the page asks about the first predictable and the creative one)."""
    return Question(f"helper.{preset_title}", f"Which helper will make **{preset_title}** fastest?", tuple(helper_titles))


def reveal_helper(title: str, speedup: float, runner_up: str | None, runner_speedup: float | None,
                  tied: Sequence[tuple[str, float]] = (), margin: float = 0.0) -> Reveal:
    """The helper answer; `tied`: the other helpers within `margin` of the fastest (each then counts as right)."""
    if tied:
        names = [title, *(t for t, _ in tied)]
        return Reveal(title, _tie(names, [speedup, *(x for _, x in tied)], margin, "were"), also=tuple(names[1:]))
    second = (f" Next: {runner_up}, {runner_speedup:.2f}×." if runner_up is not None and runner_speedup is not None
              else "")
    return Reveal(title, f"Measured: {title} was fastest, {speedup:.2f}× as fast as the big model alone.{second}")


def reveal_same(n_same: int, n: int, calls_spec: int, calls_plain: int) -> Reveal:
    """The Same answer page's greedy question, answered by this run's own comparison."""
    if n_same == n:
        return Reveal(SAME.choices[0], f"Measured: all {n} words were the same, and the big model needed {calls_spec} "
                      f"turns with the helper instead of {calls_plain}.")
    return Reveal(SAME.choices[1], f"Measured: {n_same} of {n} words matched. The texts parted at a near-tie, from "
                  "how the computer adds numbers, not from a bad guess (the box below says why).")


def reveal_row_bits(equal_by_kernel: Sequence[tuple[str, bool, bool]]) -> Reveal:
    """The row-bits question, answered by this machine's checks: (kernel, ours, every batch size equal) per kernel."""
    ours = [equal for _, mine, equal in equal_by_kernel if mine]
    others = [equal for _, mine, equal in equal_by_kernel if not mine]
    moved = [name for name, _, equal in equal_by_kernel if not equal]
    if all(ours) and all(others):
        return Reveal(ROW_BITS.choices[0], "Measured: every kernel on this machine gave the row the same bits alone "
                      "and in a batch.")
    if all(ours):
        return Reveal(ROW_BITS.choices[1], "Measured: specviz's kernels kept every bit; "
                      f"{', '.join(moved)} changed the row's bits with the batch.")
    return Reveal(ROW_BITS.choices[2], f"Measured: {', '.join(moved)} changed the row's bits with the batch. One of "
                  "them is specviz's own: that is a bug (the check when the pair loads should have refused it).")


def reveal_precision(cheaper: str | None, steps_four: float, steps_sixteen: float, rows: int) -> Reveal:
    """The two-precision question: `cheaper` is "four", "sixteen", or None within a tenth of each other."""
    measured = (f"Measured here: checking {rows} new tokens cost {steps_four:.2f} of its own steps at 4 bits and "
                f"{steps_sixteen:.2f} at 16 bits.")
    if cheaper is None:
        return Reveal(PRECISION.choices[2], measured)
    why = (" Sixteen-bit steps are slow because they read three times the bytes, so the extra rows' arithmetic hides "
           "behind the reading; at four bits the reading is quick and the arithmetic shows." if cheaper == "sixteen"
           else "")
    return Reveal(PRECISION.choices[0 if cheaper == "four" else 1], measured + why)
