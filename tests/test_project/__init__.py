"""The project itself: the docs and their examples, doctests, examples/, the layers, the wheel."""
