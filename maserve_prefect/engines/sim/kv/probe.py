"""`ProbeMemo`: the probe request a router's prefix question is answered with, shared by the
replicas of one pool.

One idea: "how many prompt tokens does replica r hold cached for this request?" is asked of
every replica for the same request (`SimReplica.cached_prefix_tokens`, which a prefix-aware
dispatcher plan reads). The answer needs the request's block hashes, which depend only on the
request and the block size, so one probe `SimRequest` (hashes computed lazily, once) serves all
replicas of a pool; the memo keeps the last request probed.

Examples:
    >>> from maserve_prefect.protocol.requests import Request
    >>> memo = ProbeMemo()
    >>> r = Request("a", "", num_prompt_tokens=1024, prefix_block_hashes=(1, 2),
    ...             prefix_block_size=512)
    >>> memo.get(r, 16) is memo.get(r, 16), memo.get(r, 16).num_shareable_blocks
    (True, 64)
"""

from __future__ import annotations

from maserve_prefect.engines.sim.request import SimRequest
from maserve_prefect.protocol.outcomes import Acceptance, Ticket
from maserve_prefect.protocol.requests import Request


class ProbeMemo:
    """The probe `SimRequest` of the last request asked about (see the module docstring)."""

    __slots__ = ("_block_size", "_probe", "_request")

    def __init__(self) -> None:
        self._request: Request | None = None
        self._block_size = 0
        self._probe: SimRequest | None = None

    def get(self, request: Request, block_size: int) -> SimRequest:
        """A `SimRequest` of `request` in blocks of `block_size` (never admitted anywhere)."""
        probe = self._probe
        if probe is None or self._request is not request or self._block_size != block_size:
            ticket = Ticket(request.request_id, Acceptance.ACCEPTED)
            probe = self._probe = SimRequest(request, -1, 0.0, 0, block_size, ticket)
            self._request, self._block_size = request, block_size
        return probe
