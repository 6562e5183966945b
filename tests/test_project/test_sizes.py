"""The standing size rule (DEVELOPERS.md): no module over 450 lines of code, no function
over 60, counted by :mod:`tests.support.sizes`. The rule has no exceptions.
"""

from __future__ import annotations

import textwrap

from ..support.sizes import FUNCTION_LIMIT, MODULE_LIMIT, code_lines, measure


def test_no_module_or_function_is_over_the_rule() -> None:
    modules, functions = measure()
    over = {s.where: s.lines for s in modules if s.lines > MODULE_LIMIT}
    over |= {s.where: s.lines for s in functions if s.lines > FUNCTION_LIMIT}
    assert over == {}, f"over the size rule (DEVELOPERS.md): {over}; split them"
    assert modules and functions  # the package was measured


def test_lines_of_code_leave_out_docstrings_comments_and_blank_lines() -> None:
    source = textwrap.dedent('''
        """A module docstring
        over two lines."""

        # a comment
        def f(x):
            """A docstring."""
            def inner():  # counted in f
                return 1

            return x + inner()
    ''')
    assert len(code_lines(source)) == 4
