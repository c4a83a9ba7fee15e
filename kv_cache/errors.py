"""Exceptions that cross module boundaries."""


class UsageError(Exception):
    """Bad input from the user (flags, config, paths): one line on stderr, exit code 2."""


class ConfigError(UsageError):
    """A config.yaml problem; the message names the file and the key."""
