"""The CLI's own error: one line for the user, exit code 2 (bad input), never a traceback."""

EXIT_BAD_INPUT = 2


class CliError(Exception):
    """One line for the user; exit code 2."""
