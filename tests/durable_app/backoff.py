"""A BACKOFF for the `retrying` task backend of tests/settings.py: retry at once."""


def no_backoff(attempt):
    return 0
