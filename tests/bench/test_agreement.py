"""bench agreement: counts the leading tokens two greedy continuations share, and
refuses a model that is no GGUF file."""

import pytest

from bench import agreement


def test_leading_equal_counts_up_to_the_first_difference():
    assert agreement.leading_equal([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert agreement.leading_equal([1, 2], [1, 2, 3]) == 2
    assert agreement.leading_equal([], [1]) == 0


def test_a_model_that_is_no_gguf_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="not a GGUF"):
        agreement.main(["--model", str(tmp_path), "--out", str(tmp_path / "a.json")])
