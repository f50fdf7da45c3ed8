"""Counted nouns for stage-data's output: "1 image", "2 images", "1,000 documents"."""

from __future__ import annotations


def count(n: int, noun: str) -> str:
    """Return ``n`` with ``noun`` in the number it needs (the nouns stage-data counts take a plain -s)."""
    return f"{n:,} {noun if n == 1 else noun + 's'}"
