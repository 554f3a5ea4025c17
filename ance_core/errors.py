"""User-facing errors: the CLI prints them as one line, without a stack trace."""

from pathlib import Path


class AnceError(Exception):
    """An error the user can act on (bad input, bad config, missing file)."""


class DataError(AnceError):
    """Invalid dataset content; names the file, the line (1-based) and the problem."""

    def __init__(self, path: str | Path, problem: str, line: int | None = None):
        self.path = str(path)
        self.line = line
        self.problem = problem
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {problem}")
