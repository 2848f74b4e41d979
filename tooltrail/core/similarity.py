"""Name similarity for "Did you mean ...?" suggestions (spec §3.3).

The score is the longest common subsequence of the lowercased names over the longer name's
length, plus a small bonus for a shared prefix, so a typo near the end of a name (``basj``)
still lands on the intended tool (``bash``). Pure module: no I/O, safe anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["best_match", "common_prefix_length", "lcs_length", "similarity"]

PREFIX_WEIGHT = 0.1
"""Weight of the shared-prefix bonus relative to the LCS ratio."""


def lcs_length(a: str, b: str) -> int:
    """Return the length of the longest common subsequence of two strings.

    Characters (code points) are compared exactly; callers lowercase first when they want a
    case-insensitive measure.

    Args:
        a: the first string.
        b: the second string.

    Returns:
        The number of characters in a longest common subsequence (0 when either is empty).
    """
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return 0
    # One row of the classic DP table, sized by the shorter string.
    previous = [0] * (len(b) + 1)
    for char_a in a:
        current = [0]
        for j, char_b in enumerate(b, start=1):
            if char_a == char_b:
                current.append(previous[j - 1] + 1)
            else:
                current.append(max(previous[j], current[j - 1]))
        previous = current
    return previous[-1]


def common_prefix_length(a: str, b: str) -> int:
    """Return how many leading characters two strings share.

    Args:
        a: the first string.
        b: the second string.

    Returns:
        The length of the longest common prefix.
    """
    count = 0
    for char_a, char_b in zip(a, b, strict=False):
        if char_a != char_b:
            break
        count += 1
    return count


def similarity(a: str, b: str) -> float:
    """Score how alike two names are, case-insensitively (spec §3.3).

    ``lcs / m + (p / m) * 0.1`` when the lowercased names share a prefix of ``p`` characters,
    else ``lcs / m``, where ``m`` is the longer length. Equal names (ignoring case) and two
    empty names score 1.0, one empty name scores 0.0, and long names that differ only near
    their end can score above 1.0.

    Args:
        a: the first name.
        b: the second name.

    Returns:
        The score; ``similarity("basj", "bash") == 0.825`` and
        ``similarity("xyz", "bash") == 0.0``.
    """
    if not a and not b:
        return 1.0
    if not a or not b:
        return 0.0
    a, b = a.lower(), b.lower()
    if a == b:
        return 1.0
    m = max(len(a), len(b))
    lcs = lcs_length(a, b)
    p = common_prefix_length(a, b)
    return lcs / m + (p / m) * PREFIX_WEIGHT if p > 0 else lcs / m


def best_match(name: str, candidates: Iterable[str], threshold: float) -> str | None:
    """Return the candidate most similar to ``name``, or ``None``.

    Candidates are considered in sorted (plain string) order; the best is the highest score
    at or above ``threshold``, a tie keeps the first in that order, and a score of 0 never
    matches, whatever the threshold.

    Args:
        name: the name to match, e.g. a tool name the registry does not know.
        candidates: the known names.
        threshold: the lowest acceptable score.

    Returns:
        The best candidate, or ``None`` when none qualifies.
    """
    best: str | None = None
    best_score = 0.0
    for candidate in sorted(candidates):
        score = similarity(name, candidate)
        if score <= 0.0 or score < threshold:
            continue
        if best is None or score > best_score:
            best, best_score = candidate, score
    return best
