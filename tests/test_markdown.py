import pytest

from specrl_openrlhf.markdown import numbers, table


def test_a_table_has_its_head_its_alignment_and_a_line_a_row():
    text = table(["rule", "kept"], [["spec", 0.5], ["a|b", 1]], align=numbers(1, 2))
    assert text.splitlines() == ["| rule | kept |", "| --- | ---: |", "| spec | 0.5 |", "| a\\|b | 1 |"]


def test_a_row_of_the_wrong_width_or_an_unknown_alignment_is_refused():
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        table(["a", "b", "c"], [[1, 2]])
    with pytest.raises(ValueError, match="align takes"):
        table(["a"], [], align="middle")
