"""The one argument check every module uses for counts (tokens, batch, repeats, ...).

Pure Python, no torch: `cost` and the CLI use it as well as the engine and the benchmarks.
"""

from __future__ import annotations

import operator


def count(name: str, value, minimum: int = 1) -> int:
    """`value` as an int >= `minimum`, else a ValueError naming `name`.

    Python and numpy integers pass; floats, strings and bools do not (True is not a batch size).
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.") from None
    if number < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {number}.")
    return number
