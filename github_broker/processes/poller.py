"""The poller process: the polling daemon (sync, reviews, write queue, reaper) until
SIGINT/SIGTERM; `github-broker poll` runs it in the foreground, serve as a child."""

from __future__ import annotations

import asyncio

from github_broker.settings import Settings


def run_poller(settings: Settings, *, metrics_port: int | None = None) -> None:
    from github_broker.gateway import GitHubGateway
    from github_broker.leader.poller import Daemon
    from github_broker.store import Store

    if metrics_port is not None:
        from github_broker.metrics import serve_process_metrics

        serve_process_metrics(settings.server.host, metrics_port)

    async def run() -> None:
        store = Store.from_settings(settings)
        gateway = GitHubGateway(settings.github)
        try:
            await Daemon(settings, store, gateway).run_forever()
        finally:
            await store.close()
            await asyncio.to_thread(gateway.close)

    asyncio.run(run())
