"""Errors that name the bad input and the fix, raised before anything deep inside Ray or torch fails."""


class TroupeError(Exception):
    """Base class for every error troupe raises on purpose."""


class ConfigError(TroupeError, ValueError):
    """A config key, type or value is wrong; the message names the key and what is allowed."""


class RegistryError(TroupeError, KeyError):
    """An unknown name was asked of a registry; the message lists what is registered."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class PlacementTimeout(TroupeError, TimeoutError):
    """Placement groups were not granted in time; the message names the pending bundles."""


class PlacementInfeasible(ConfigError):
    """A bundle fits no node the cluster can have; the message names it and the largest offer."""


class DataError(TroupeError, ValueError):
    """A dataset row or a data file lacks a required field or holds a bad value."""


class RemoteCallError(TroupeError, RuntimeError):
    """A call to an actor failed or timed out; the message names the role, rank and method."""
