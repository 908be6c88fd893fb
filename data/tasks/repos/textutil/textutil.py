"""Small text helpers, one of them wrong."""


def slugify(title: str) -> str:
    """Lower-case words joined by single dashes: "Hello,  World!" -> "hello-world"."""
    words = "".join(c if c.isalnum() else " " for c in title).split(" ")
    return "-".join(w.lower() for w in words)


def shout(text: str) -> str:
    return text.upper() + "!"
