class BebopError(Exception):
    """A problem with the user's input. The CLI prints it as one line and exits non-zero."""
