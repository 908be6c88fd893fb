from textutil import shout, slugify


def test_slugify_collapses_separators():
    assert slugify("Hello,  World!") == "hello-world"


def test_slugify_plain():
    assert slugify("polar") == "polar"


def test_shout_empty():
    assert shout("") == "!"
