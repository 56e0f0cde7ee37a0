"""What ``tangentlens suite`` prints (:mod:`tangentlens.report.suite_summary`): token counts in
short units, a mini suite's and a catalogue suite's header facts and table of checkpoints
(columns, alignment, values, "–" where a loss is missing), and what checking the checkpoints
found (identical, damaged, unconfirmed, not on this machine, all verified). The suites are
stand-ins with hand-set metadata; nothing is trained, read or downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tangentlens.models.hub_suites import HubSuiteEntry
from tangentlens.models.suites import (
    CatalogueSuite,
    DuplicateCheckpoints,
    MiniSuite,
    SuiteIntegrity,
)
from tangentlens.report import suite_summary

CLEAN = SuiteIntegrity([], {}, {}, [], checked=[0, 100])
WIDTH = 100
ROOT = Path("/cache/suites/mini-bert-0123")  # never read


@pytest.fixture
def shown(monkeypatch) -> Console:
    """The console the summary prints on, recording, 100 characters wide, without colour."""
    console = Console(record=True, width=WIDTH, highlight=False, color_system=None)
    monkeypatch.setattr(suite_summary, "console", console)
    return console


def _text(console: Console) -> list[str]:
    """The lines printed, without trailing spaces; the rule's title and length checked."""
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    return lines


class _Mini(MiniSuite):
    """A mini suite of steps 0, 100 and 200 (2048 tokens per step) as its metadata describes
    it, without a folder; ``verify`` answers ``report`` and records the steps it was given."""

    def __init__(self, checkpoints: dict[str, dict[str, Any]], root: Path = ROOT, **report: Any):
        self._folders = {int(step): root / f"step{step}" for step in checkpoints}
        self.root, self.name, self.kind, self.family = root, "mini-bert", "mini-bert", "encoder"
        self.tokens_per_step = 2048
        self.metadata = {
            "data": {
                "train_tokens": 1_500_000,
                "heldout_tokens": 12_345,
                "train_documents": 40,
                "heldout_documents": 4,
            },
            "unigram_entropy": 6.12345,
            "training_seconds": 41.6,
            "checkpoints": checkpoints,
        }
        self.report = SuiteIntegrity(**{**CLEAN.__dict__, **report})
        self.verified: list[list[int]] = []

    def verify(self, steps: Any = None) -> SuiteIntegrity:
        self.verified.append(list(steps))
        return self.report


CHECKPOINTS = {
    "0": {"train_loss": None, "val_loss": 9.87654, "val_loss_mask": 9.5},
    "100": {"train_loss": 4.5, "val_loss": 5.25},
    "200": {"train_loss": 3.25, "val_loss": 4.0, "val_loss_mask": 4.75},
}


class _Catalogue(CatalogueSuite):
    """A catalogue suite of steps 0, 1000 and 2000 from ``entry`` (no hub, no cache)."""

    def __init__(self, entry: HubSuiteEntry, report: SuiteIntegrity = CLEAN):
        self.entry, self.name, self.family = entry, entry.hub_id, "decoder"
        self.offline, self.published_confirmed = True, entry.verified
        self.report = report

    def verify(self, steps: Any = None) -> SuiteIntegrity:
        return self.report


def _entry(verified: bool = True, tokens_per_step: int | None = 4_194_304, note: str = ""):
    revisions = tuple((step, f"stage1-step{step}") for step in (0, 1000, 2000))
    return HubSuiteEntry("org/model-1b", "model-1b", "decoder", "bridge", revisions,
                         tokens_per_step, {"model_type": "olmo"}, verified, "the model card",
                         note)  # fmt: skip


# ---------------------------------------------------------------------------------- tokens


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "?"),
        (0, "0"),
        (999, "999"),
        (1000, "1k"),
        (12_345, "12.3k"),
        (1_000_000, "1M"),
        (1_500_000, "1.5M"),
        (1_000_000_000, "1B"),
        (2_345_000_000, "2.35B"),
        (1_000_000_000_000, "1T"),
        (4_000_000_000_000, "4T"),
    ],
)
def test_tokens_are_shown_with_three_significant_digits_and_a_unit_from_1000_on(n, text):
    """Unknown is "?", under 1000 the count itself, from each power of 1000 on its unit."""
    assert suite_summary._tokens(n) == text


# ------------------------------------------------------------------------------ mini suite


def test_a_mini_suite_shows_its_corpus_training_and_each_checkpoints_losses(shown):
    """The rule names the suite, its kind and family; the facts give the checkpoints shown,
    tokens per step, the corpus' tokens and documents, its unigram entropy, the training time
    and the folder; the table a row per checkpoint: step and tokens seen right-justified, the
    training loss ("–" where none was recorded), the held-out loss and, for an encoder, the
    loss at [MASK] inputs ("–" where none). Nothing is verified unless asked."""
    suite = _Mini(CHECKPOINTS)
    suite_summary.render_suite(suite)
    lines = _text(shown)
    assert len(lines[0]) == WIDTH and lines[0].strip("─") == " mini-bert · mini-bert · encoder "
    assert lines[1:] == [
        "  3 checkpoints (0 … 200 shown: 3)",
        "  2048 tokens per step; 1.5M training tokens, 12.3k held-out tokens (40 / 4 documents)",
        f"  unigram entropy of the corpus: 6.123 nats; trained in 42 s; cached at {ROOT}",
        "step  tokens seen  train loss  held-out loss  at [MASK] inputs",
        "   0            0           –          9.877             9.500",
        " 100         205k       4.500          5.250                 –",
        " 200         410k       3.250          4.000             4.750",
    ]
    assert suite.verified == []


def test_the_selected_steps_only_are_tabled_and_verified(shown):
    """``steps``: the table lists those; ``verify``: the suite checks those steps and, with
    nothing found, says so (a mini suite has no published config to name)."""
    suite = _Mini(CHECKPOINTS)
    suite_summary.render_suite(suite, [100, 200], verify=True)
    lines = _text(shown)
    assert lines[1] == "  3 checkpoints (100 … 200 shown: 2)"
    assert [line.split()[0] for line in lines[5:7]] == ["100", "200"]
    assert lines[7:] == [
        "checkpoints verified (steps 0, 100): weights whole, configs consistent, no duplicates"
    ]
    assert suite.verified == [[100, 200]]


def test_a_damaged_checkpoint_is_shown_then_refused(shown):
    """Verification that finds a damaged checkpoint prints it, then raises with the count."""
    suite = _Mini(CHECKPOINTS, damaged={100: "truncated file"})
    with pytest.raises(ValueError, match=r"^1 damaged or inconsistent checkpoint\(s\)$"):
        suite_summary.render_suite(suite, verify=True)
    assert _text(shown)[-1] == "checkpoint at step 100 is damaged: truncated file"


def test_a_decoder_without_masked_losses_has_no_mask_column(shown):
    """No checkpoint recorded a loss at [MASK] inputs: no such column."""
    checkpoints = {step: {"train_loss": 2.0, "val_loss": 3.0} for step in ("0", "100")}
    suite_summary.render_suite(_Mini(checkpoints))
    assert _text(shown)[-3:] == [
        "step  tokens seen  train loss  held-out loss",
        "   0            0       2.000          3.000",
        " 100         205k       2.000          3.000",
    ]


def test_the_table_header_is_bold(monkeypatch):
    """The column names are printed bold."""
    console = Console(record=True, width=WIDTH, force_terminal=True, color_system="standard")
    monkeypatch.setattr(suite_summary, "console", console)
    suite_summary.render_suite(_Mini(CHECKPOINTS))
    assert "\x1b[1mstep\x1b[0m" in console.export_text(styles=True)


# ------------------------------------------------------------------------- catalogue suite


def test_a_catalogue_suite_shows_its_source_loader_tokens_revisions_and_note(shown):
    """Verified: the source; the loader, tokens per step with thousands separators, the first
    and last revision; the note; a revision column."""
    suite_summary.render_suite(_Catalogue(_entry(note="steps from the card")), [0, 2000])
    lines = _text(shown)
    assert len(lines[0]) == WIDTH and lines[0].strip("─") == " org/model-1b · hub · decoder "
    assert lines[1:] == [
        "  3 checkpoints (0 … 2000 shown: 2)",
        "  verified: the model card",
        "  loader bridge; 4,194,304 tokens per step; revisions stage1-step0 … stage1-step2000",
        "  note: steps from the card",
        "step  tokens seen  revision",
        "   0            0  stage1-step0",
        "2000        8.39B  stage1-step2000",
    ]


def test_an_unverified_catalogue_suite_says_so_and_may_not_know_its_tokens(shown):
    """Unverified: UNVERIFIED before the source; no tokens per step: unknown, "?" in the
    table; no note: no note line."""
    suite_summary.render_suite(_Catalogue(_entry(verified=False, tokens_per_step=None)), [0])
    assert _text(shown)[2:] == [
        "  UNVERIFIED: the model card",
        "  loader bridge; tokens per step unknown; revisions stage1-step0 … stage1-step2000",
        "step  tokens seen  revision",
        "   0            ?  stage1-step0",
    ]


def test_a_catalogue_suite_verified_names_its_published_config(shown):
    """A suite with a published config: verified checkpoints' configs are that one."""
    suite_summary.render_suite(_Catalogue(_entry()), [0], verify=True)
    assert _text(shown)[-1] == (
        "checkpoints verified (steps 0, 100): weights whole, configs consistent, each "
        "config.json the published one, no duplicates"
    )


# ------------------------------------------------------------------------------- integrity

LONG = "x" * 120  # wider than the console: printed on one line


def _integrity(report: SuiteIntegrity, monkeypatch, **kwargs: Any) -> list[str]:
    console = Console(record=True, width=WIDTH, highlight=False, color_system=None)
    monkeypatch.setattr(suite_summary, "console", console)
    suite_summary.render_integrity(report, **kwargs)
    return _text(console)


def test_identical_damaged_and_unchecked_checkpoints_and_no_verified_line(monkeypatch):
    """Each pair of identical checkpoints with the first 12 characters of their hash, each
    problem and warning on one line however long, the steps not on this machine; with any of
    those, no "verified" line."""
    report = SuiteIntegrity(
        [DuplicateCheckpoints(100, 200, "0123456789abcdef")],
        {200: LONG},
        {},
        [0, 300],
        checked=[100, 200],
    )
    assert _integrity(report, monkeypatch) == [
        "identical checkpoints: steps 100 and 200 have the same weights (0123456789ab)",
        f"checkpoint at step 200 is damaged: {LONG}",
        "not on this machine, not checked: steps 0, 300",
    ]


@pytest.mark.parametrize(
    "found",
    [
        {"duplicates": [DuplicateCheckpoints(0, 100, "0123456789abcdef")]},
        {"damaged": {100: "truncated"}},
        {"published_differs": {100: {"vocab_size": [50304, 50277]}}, "published_confirmed": False},
    ],
    ids=["identical", "damaged", "unconfirmed"],
)
def test_anything_found_leaves_out_the_verified_line(monkeypatch, found):
    """A duplicate alone, a problem alone or a warning alone: no "verified" line."""
    lines = _integrity(SuiteIntegrity(**{**CLEAN.__dict__, **found}), monkeypatch)
    assert not any(line.startswith("checkpoints verified") for line in lines)
    assert len(lines) == 1


def test_an_unconfirmed_config_is_one_warning_line(monkeypatch):
    """A config that differs from the catalogue's unconfirmed one: a warning, on one line."""
    report = SuiteIntegrity(
        **{
            **CLEAN.__dict__,
            "published_differs": {100: {"vocab_size": [50304, 50277]}},
            "published_confirmed": False,
        }
    )
    (line,) = _integrity(report, monkeypatch)
    assert line == (
        "config.json at step 100 differs from the catalogue's unconfirmed config: vocab_size "
        "50277 (catalogue 50304); the memory plan and the planning checks read the catalogue's"
    )


def test_nothing_on_this_machine_is_nothing_verified(monkeypatch):
    """No checkpoint checked: the steps not checked, and that nothing was verified."""
    report = SuiteIntegrity([], {}, {}, [0, 100])
    assert _integrity(report, monkeypatch) == [
        "not on this machine, not checked: steps 0, 100",
        "nothing verified: none of these checkpoints is on this machine",
    ]


def test_all_verified_names_the_steps_and_the_published_config_only_when_asked(monkeypatch):
    """All checked and sound: one line naming the steps, on one line however narrow the
    console; the published config named only with ``published``."""
    assert _integrity(CLEAN, monkeypatch) == [
        "checkpoints verified (steps 0, 100): weights whole, configs consistent, no duplicates"
    ]
    assert _integrity(CLEAN, monkeypatch, published=True) == [
        "checkpoints verified (steps 0, 100): weights whole, configs consistent, each "
        "config.json the published one, no duplicates"
    ]
