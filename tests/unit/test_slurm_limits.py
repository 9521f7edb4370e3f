"""The scheduler-limit parsers and the array split, against hand-computed values."""

from __future__ import annotations

import pytest

from hpctrain.errors import LaunchError
from hpctrain.launch.slurm.limits import Limits, parse_max_array_size, parse_max_submit, ranges_text

CONFIG = """Configuration data as of 2026-11-22T15:46:40
MailProg                = /bin/mail
MaxArraySize            = 1001
MaxBatchRequeue         = 5
MaxJobCount             = 20000
"""


def test_max_array_size_is_read_from_scontrol_show_config() -> None:
    assert parse_max_array_size(CONFIG) == 1001
    assert parse_max_array_size("MaxJobCount = 5\n") is None


def test_max_submit_is_the_smallest_limit_set() -> None:
    assert parse_max_submit("|\n|\n") is None  # association and QOS without limits
    assert parse_max_submit("500\n\n40\n") == 40


@pytest.mark.parametrize(
    ("n", "size", "expected"),
    [
        (1500, 1001, [(0, 1001), (1001, 1500)]),
        (1001, 1001, [(0, 1001)]),
        (1002, 1001, [(0, 1001), (1001, 1002)]),
        (3, 1, [(0, 1), (1, 2), (2, 3)]),
    ],
)
def test_a_group_is_split_into_arrays_of_at_most_max_array_size(n: int, size: int, expected: list) -> None:
    parts = Limits(size, None, 0, "").arrays(n)
    assert [(p.start, p.stop) for p in parts] == expected


def test_index_ranges_are_printed_compactly() -> None:
    assert ranges_text([9, 1, 2, 3, 7, 10]) == "1-3,7,9-10"
    assert ranges_text(list(range(1500))) == "0-1499"
    assert ranges_text([4]) == "4" and ranges_text([]) == ""


def test_a_sweep_beyond_max_submit_jobs_is_refused_before_submitting() -> None:
    from hpctrain.launch.slurm.submit import check_room

    limits = Limits(1001, max_submit_jobs=10, queued=7, source="")
    assert limits.room() == 3
    check_room([object()] * 3, limits)  # type: ignore[list-item]
    with pytest.raises(LaunchError, match=r"MaxSubmitJobs=10 with 7 job\(s\) already pending or running"):
        check_room([object()] * 4, limits)  # type: ignore[list-item]
