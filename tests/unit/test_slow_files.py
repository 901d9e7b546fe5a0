"""The order the test stages hand out files in (tests/conftest.py): the listed slow files
first, in the list's order, each file's tests together; and the list names files that exist,
so a renamed file is not silently dropped to the end."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SLOW_FILES, slow_files, slowest_first

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("paths", "slow", "expected"),
    [
        (["a", "b", "c"], [], ["a", "b", "c"]),
        (["a", "b", "c"], ["c"], ["c", "a", "b"]),
        (["a", "a", "b", "c", "c"], ["c", "b"], ["c", "c", "b", "a", "a"]),
        (["a", "b"], ["z", "b"], ["b", "a"]),  # a listed file not collected changes nothing
    ],
)
def test_the_listed_files_go_first_in_the_lists_order(
    paths: list[str], slow: list[str], expected: list[str]
) -> None:
    assert [paths[i] for i in slowest_first(paths, slow)] == expected


def test_a_files_tests_keep_their_order() -> None:
    paths = ["a", "b", "a", "b"]
    assert slowest_first(paths, ["b"]) == [1, 3, 0, 2]


def test_the_list_reads_paths_and_skips_comments() -> None:
    text = "# header\n\ntests/x.py  # 12\n  tests/y.py\n"
    assert slow_files(text) == ["tests/x.py", "tests/y.py"]


def test_every_listed_file_exists_once() -> None:
    listed = slow_files(SLOW_FILES.read_text())
    assert listed and len(listed) == len(set(listed))
    assert [p for p in listed if not (ROOT / p).is_file()] == []
