"""`/broker …` commands in issue comments: maintainers steer from GitHub itself.

`grammar.py` reads the commands out of a comment's body (bounded, checked), `access.py`
decides who may give them (GitHub's permission API, cached in Redis), `runner.py` takes one
comment from either path (a webhook delivery, the poller's read of new comments) through
those and the steering use cases, and answers on GitHub; `scan.py` is the poller's read.
"""

from github_broker.steering.commands.runner import CommentCommands

__all__ = ["CommentCommands"]
