"""Lists in one-line messages: a job of a thousand ranks must not turn "which ranks" into a thousand numbers."""

from __future__ import annotations

from collections.abc import Iterable

SHOWN = 3
"""The most items a message lists by name; the rest are counted ("and 997 more")."""


def few(items: Iterable[object], conjunction: str = "and", separator: str = ", ") -> str:
    """``items`` as words for a message, at most SHOWN of them: "1", "1 and 2", "1, 2, 3 and 4",
    "1, 2, 3 and 997 more". ``conjunction`` "or" reads "1 or 2"; ``separator`` "; " joins longer items."""
    words = [str(item) for item in items]
    if len(words) <= 1:
        return "".join(words)
    if len(words) > SHOWN + 1:  # "and 1 more" would be no shorter than naming it
        return f"{separator.join(words[:SHOWN])} {conjunction} {len(words) - SHOWN} more"
    return f"{separator.join(words[:-1])} {conjunction} {words[-1]}"


def name_ranks(ranks: Iterable[int], conjunction: str = "and") -> str:
    """"rank 3", "ranks 0 and 1", "ranks 0, 1, 2 and 997 more" (or "ranks 0 or 1" with ``conjunction`` "or")."""
    ranks = list(ranks)
    return f"rank{'s' if len(ranks) > 1 else ''} {few(ranks, conjunction)}"
