import itertools
import math

import pytest

from tangentlens.models.schedule import (
    PYTHIA_STEPS,
    log_spaced_schedule,
    nearest_steps,
    select_steps,
)


def test_pythia_has_154_revisions_with_the_published_shape():
    assert len(PYTHIA_STEPS) == 154
    assert PYTHIA_STEPS[:12] == (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000)
    assert PYTHIA_STEPS[-1] == 143_000
    gaps = {b - a for a, b in itertools.pairwise(PYTHIA_STEPS[11:])}
    assert gaps == {1000}


def test_log_spaced_schedule_matches_pythia_shape():
    assert log_spaced_schedule(143_000, 1000) == PYTHIA_STEPS
    assert log_spaced_schedule(500, 100) == (0, 1, 2, 4, 8, 16, 32, 64, 100, 200, 300, 400, 500)
    # a last step that is not a multiple of `every` is still saved
    assert log_spaced_schedule(250, 100)[-3:] == (100, 200, 250)
    assert log_spaced_schedule(1, 1) == (0, 1)


@pytest.mark.parametrize("total, every", [(0, 1), (10, 0), (10, 11)])
def test_log_spaced_schedule_rejects_bad_arguments(total, every):
    with pytest.raises(ValueError):
        log_spaced_schedule(total, every)


def test_select_all_first_last_and_lists():
    steps = [0, 1, 2, 4, 100, 200]
    assert select_steps(steps, "all") == steps
    assert select_steps(steps, "first") == [0]
    assert select_steps(steps, "last") == [200]
    assert select_steps(steps, 4) == [4]
    assert select_steps(steps, [200, 0, 200]) == [0, 200]
    assert select_steps(steps, "200, 0,last") == [0, 200]


def test_select_ranges_are_inclusive_and_open_ended():
    steps = list(PYTHIA_STEPS)
    assert select_steps(steps, "1000..3000") == [1000, 2000, 3000]
    assert select_steps(steps, "..2") == [0, 1, 2]
    assert select_steps(steps, "142000..") == [142_000, 143_000]
    assert select_steps(steps, "3..7") == [4]
    assert select_steps(steps, "0,1000..2000") == [0, 1000, 2000]


def test_log_selection_includes_ends_and_is_log_spaced():
    steps = list(PYTHIA_STEPS)
    chosen = select_steps(steps, "log:8")
    assert len(chosen) == 8
    assert chosen[0] == 0 and chosen[-1] == 143_000
    # brute force: each chosen interior step is the available step nearest its log target
    coords = [math.log1p(s) for s in chosen]
    gaps = [b - a for a, b in itertools.pairwise(coords)]
    ideal = math.log1p(143_000) / 7
    assert max(abs(g - ideal) for g in gaps) < 0.5 * ideal
    assert select_steps(steps, "log:1000") == steps
    assert select_steps([0, 1, 2], "log:2") == [0, 2]


def test_log_selection_gives_distinct_steps_when_targets_collide():
    steps = [0, 1, 2, 3, 1000]
    chosen = select_steps(steps, "log:4")
    assert len(chosen) == 4 and chosen[0] == 0 and chosen[-1] == 1000


@pytest.mark.parametrize(
    "selection, message",
    [
        (3, "not a checkpoint"),
        ("7", "nearest"),
        ("5..5", "holds no checkpoint"),
        ("9..3", "empty"),
        ("every:3", "allowed"),
        ("log:0", "N ≥ 1"),
        ("1,,2", "empty term"),
        ([], "integer steps"),
        ([1.5], "integer steps"),
        (True, "allowed"),
    ],
)
def test_bad_selections_name_the_problem(selection, message):
    with pytest.raises(ValueError, match=message):
        select_steps([0, 1, 2, 4, 8], selection)


def test_nearest_steps_for_messages():
    assert nearest_steps(PYTHIA_STEPS, 1500) == [512, 1000, 2000]
    assert nearest_steps([0, 10, 20], 11, k=1) == [10]
