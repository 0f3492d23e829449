"""The one exception type for input a user can fix (bad sizes, grids, variants)."""


class InputError(ValueError):
    """Bad input: the command line maps it to a one-line message and exit status 2."""
