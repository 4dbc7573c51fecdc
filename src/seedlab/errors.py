"""Errors that reach the user as one line and exit code 2 (never a traceback)."""

from __future__ import annotations


class SeedlabError(Exception):
    """Bad input: the CLI prints ``error: <message>`` on stderr and exits with 2."""

    exit_code = 2


def field_error(field: str, allowed: str, got: object) -> SeedlabError:
    """The standard shape of a bad-field message: which field, what is allowed, what came."""
    return SeedlabError(f"{field}: {allowed}, got {got!r}")


def in_seed(seed: int, err: BaseException) -> SeedlabError:
    """Any failure of one seed's work in a process of its own as one line naming the seed (its first
    line; the exception's type where it was not a SeedlabError)."""
    line = (str(err).strip().splitlines() or [""])[0]
    line = line if isinstance(err, SeedlabError) else f"{type(err).__name__}: {line}"
    return SeedlabError(line if line.startswith(f"seed {seed}:") else f"seed {seed}: {line}")
