"""The project's exception tree: one root, builtin mixins where callers expect them.

Every message says what was wrong, where (file, line, op id, element name) and what to do.

    MaserveError
    ├── SpecError (ValueError)              invalid workload spec / template config
    ├── TraceError
    │   ├── TraceValidationError (ValueError)   graph or record invariant broken
    │   ├── TraceImportError (ValueError)       bad input file (names file and line)
    │   ├── IntegrityError                      CAS blob does not match its digest
    │   ├── BlobNotFoundError (LookupError)     no CAS blob with that digest
    │   ├── TraceNotFoundError (LookupError)    no ledger run with that trace id
    │   ├── BundleExistsError (FileExistsError) export target exists; pass --force / overwrite=True
    │   ├── TraceExportError                    a file or endpoint took no export (names it)
    │   └── IllegalReleaseError (ValueError)    release change drops a required edge / makes a cycle
    ├── EngineError
    │   ├── RequestError (ValueError)           malformed engine request (names the request id)
    │   ├── UnsupportedError                    engine cannot honour a control or lifecycle action
    │   └── SimulationError                     a simulator event failed (carries its cause)
    ├── ConfigError (ValueError)            bad settings, catalog entry or CLI option
    └── PrefectServerError                  the Prefect API is unreachable or its server failed
"""

from __future__ import annotations


class MaserveError(Exception):
    """Root of every error this package raises on purpose."""


class SpecError(MaserveError, ValueError):
    """A workload spec or template config is invalid; the message names the element."""


class TraceError(MaserveError):
    """Problems with Semantic Trace data."""


class TraceValidationError(TraceError, ValueError):
    """A trace breaks an invariant (cycle, dangling edge, missing payload, duplicate id)."""


class TraceImportError(TraceError, ValueError):
    """An input file could not be imported; the message names the file and line."""


class IntegrityError(TraceError):
    """A content-addressed blob's bytes do not hash to its digest."""


class BlobNotFoundError(TraceError, LookupError):
    """No blob with the requested digest is in the content-addressed store."""


class TraceNotFoundError(TraceError, LookupError):
    """The ledger holds no run with the requested trace id."""


class BundleExistsError(TraceError, FileExistsError):
    """A bundle export would overwrite a non-empty folder without `overwrite=True`."""


class TraceExportError(TraceError):
    """A trace could not be written to a file or sent to an endpoint (the message names it)."""


class IllegalReleaseError(TraceError, ValueError):
    """A release change would drop a required edge or create a cycle."""


class EngineError(MaserveError):
    """Engine-side failures."""


class DiscoveryTimeoutError(EngineError):
    """Server discovery ran out of its time budget (a replay gives it the arm's timeout)."""


class RequestError(EngineError, ValueError):
    """An engine request is malformed (both or neither prompt form, bad lengths)."""


class UnsupportedError(EngineError):
    """The engine cannot do what was asked; it says so instead of pretending."""


class SimulationError(EngineError):
    """A simulator event failed; `__cause__` holds the original exception."""


class ConfigError(MaserveError, ValueError):
    """Bad settings, catalog entries or command-line options."""


class PrefectServerError(MaserveError):
    """The Prefect API does not answer, or the managed local server failed to start."""
