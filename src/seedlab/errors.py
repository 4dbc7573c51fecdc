"""Errors that reach the user as one line and exit code 2 (never a traceback)."""

from __future__ import annotations


class SeedlabError(Exception):
    """Bad input: the CLI prints ``error: <message>`` on stderr and exits with 2."""

    exit_code = 2


def field_error(field: str, allowed: str, got: object) -> SeedlabError:
    """The standard shape of a bad-field message: which field, what is allowed, what came."""
    return SeedlabError(f"{field}: {allowed}, got {got!r}")
