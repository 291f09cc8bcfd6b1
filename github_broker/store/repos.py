"""The configured repositories' stores, each built the first time a caller asks for it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from github_broker.store.repo import RepoStore


class RepoStores(Mapping[str, RepoStore]):
    """Every configured repository by full name, in configuration order; a repository's
    `RepoStore` is built on first use and kept. A process holds stores only for the
    repositories it touched (an API worker: those its claims, heartbeats and reads reached),
    not one per configured repository. Iterating the names builds nothing; `values()` and
    `items()` build every store (reports over all repositories)."""

    def __init__(self, names: list[str], build: Callable[[str], RepoStore]) -> None:
        self._names = dict.fromkeys(names)
        self._build = build
        self._built: dict[str, RepoStore] = {}

    def __getitem__(self, name: str) -> RepoStore:
        found = self._built.get(name)
        if found is None:
            if name not in self._names:
                raise KeyError(name)
            found = self._built[name] = self._build(name)
        return found

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def built(self) -> list[RepoStore]:
        """The stores built so far (for settings changed after start: `durable_wait`)."""
        return list(self._built.values())
