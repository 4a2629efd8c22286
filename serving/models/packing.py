"""Rows of many sequences packed back to back: sequence b owns rows [begin_b, begin_b + count_b)."""

from __future__ import annotations

from typing import Iterable


def row_slices(counts: Iterable[int]) -> list[slice]:
    """Each sequence's rows of the packed [sum(counts)] dimension, in order."""
    out, begin = [], 0
    for count in counts:
        out.append(slice(begin, begin + count))
        begin += count
    return out
