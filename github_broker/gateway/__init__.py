"""The GitHub gateway: every call to GitHub goes through here (PyGithub's requester).

Blocking by nature (PyGithub is synchronous): async callers run these methods in a worker
thread (`asyncio.to_thread`), never on the event loop. `transport.py` makes the requests
(quota, pacing, conditional cache, errors), `reads.py` and `writes.py` the endpoints,
`checks.py` the reads of pull requests' CI and mergeability, `planning.py` the dependency
graph read in bulk (GraphQL), `progress.py` held tasks' branches and pull requests across
repositories (GraphQL, one request per pass).
"""

from github_broker.gateway.checks import ChecksQuery, ChecksReads
from github_broker.gateway.planning import IssueLinks, Linked, PlanningReads
from github_broker.gateway.progress import HeldBranch, ProgressReads
from github_broker.gateway.reads import Page, Reads
from github_broker.gateway.transport import Transport, counting_calls, network_problem
from github_broker.gateway.writes import Writes

__all__ = [
    "ChecksQuery",
    "GitHubGateway",
    "HeldBranch",
    "IssueLinks",
    "Linked",
    "Page",
    "Transport",
    "counting_calls",
    "network_problem",
]


class GitHubGateway(Reads, Writes, ChecksReads, PlanningReads, ProgressReads):
    """Thin, typed access to the REST endpoints the broker uses."""
