"""How memwall writes numbers for people: bytes, rates, parameter counts, durations.

One formatter for the whole package (the CLI, the benchmarks' tables). The widgets' calculator
keeps its own `format_bytes`, because it must print exactly what its JavaScript twin prints.
"""

from __future__ import annotations

_SI_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_BINARY_PREFIXES = ((5, "Pi"), (4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki"))


def si(value: float, unit: str) -> str:
    """4 significant digits with an SI prefix: si(16.06e9, 'B') == '16.06 GB'."""
    for scale, prefix in _SI_PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:.4g} {unit}"


def human_bytes(n: float) -> str:
    """Decimal and binary units side by side, since datasheets use GB and memory is sized in GiB."""
    for power, prefix in _BINARY_PREFIXES:
        if n >= 1024**power:
            return f"{si(n, 'B')} ({n / 1024**power:.4g} {prefix}B)"
    return f"{n:.4g} B"


def parameter_count(n: float) -> str:
    """Parameter counts the way model names write them: 8.03B, 135M."""
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.4g}M"


def seconds(t: float) -> str:
    """Milliseconds below a second, seconds above."""
    return f"{t * 1e3:.3g} ms" if t < 1 else f"{t:.3g} s"


def print_table(title: str, rows: list[tuple[str, str]]) -> None:
    """A title and aligned `label  value` rows, as `memwall info` and `memwall calc` print them."""
    print(title)
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")
