import pytest
from calc import add, mean


def test_mean():
    assert mean([1.0, 2.0, 3.0]) == 2.0


def test_mean_single():
    assert mean([4.0]) == 4.0


def test_add_negative():
    assert add(-1, 1) == 0


def test_mean_empty_raises():
    with pytest.raises(ZeroDivisionError):
        mean([])
