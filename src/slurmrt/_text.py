"""Text said to users, kept to a length: one rule for every line that quotes an error or a reason."""

from __future__ import annotations

__all__ = ["shorten"]


def shorten(text: str, limit: int = 200) -> str:
    """``text``'s first line, at most ``limit`` characters: cut at the last word that fits and ended with "…" (a
    single word longer than the limit is cut inside it), never mid-word otherwise."""
    stripped = text.strip()
    line = stripped.splitlines()[0] if stripped else ""
    if len(line) <= limit:
        return line
    head = line[:limit - 1]
    cut = head.rsplit(" ", 1)[0] if " " in head else head
    return cut.rstrip(" ,;:") + "…"
