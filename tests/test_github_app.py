"""GitHub App authentication: the broker mints installation tokens and uses them."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from github_broker.errors import ConfigError, GitHubError
from github_broker.gateway import GitHubGateway
from github_broker.settings import Settings
from github_broker.simulator import Simulator, generate_issues

APP_ID, INSTALLATION = 4242, 7


def pem_pair() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


@pytest.fixture(scope="module")
def keys() -> tuple[str, str]:
    return pem_pair()


@pytest.fixture
def sim(keys: tuple[str, str]) -> Iterator[Simulator]:
    seed = {"repositories": [{"owner": "acme", "name": "widgets", "issues": generate_issues(3)}]}
    # tokens={}: only tokens the simulator issued itself are accepted.
    with Simulator(seed, tokens={}, apps={APP_ID: keys[1]}) as s:
        yield s


def app_settings(make_settings: Callable[..., Settings], sim: Simulator, private: str) -> Settings:
    return make_settings(
        github={
            "base_url": sim.base_url,
            "token": None,
            "app_id": APP_ID,
            "app_installation_id": INSTALLATION,
            "app_private_key": private,
        }
    )


def test_app_installation_token_is_minted_and_used(
    sim: Simulator, keys: tuple[str, str], make_settings: Callable[..., Settings]
) -> None:
    gateway = GitHubGateway(app_settings(make_settings, sim, keys[0]).github)
    try:
        page = gateway.issues_page("acme/widgets", {"state": "open"}, page=1)
        assert len(page.items) == 3
        gateway.add_labels("acme/widgets", 1, ["in-progress"])
    finally:
        gateway.close()
    assert "in-progress" in sim.state.issue_labels("acme", "widgets", 1)
    routes = sim.stats.snapshot()["by_route"]
    assert routes["POST /app/installations/{installation_id}/access_tokens"] == 1


def test_a_key_github_does_not_know_is_refused(
    sim: Simulator, make_settings: Callable[..., Settings]
) -> None:
    stranger, _ = pem_pair()
    gateway = GitHubGateway(app_settings(make_settings, sim, stranger).github)
    try:
        with pytest.raises(GitHubError) as refused:
            gateway.issues_page("acme/widgets", {"state": "open"}, page=1)
    finally:
        gateway.close()
    assert refused.value.status == 401


def test_half_an_app_configuration_is_a_config_error(
    make_settings: Callable[..., Settings],
) -> None:
    with pytest.raises(ConfigError, match="app_installation_id"):
        make_settings(github={"token": None, "app_id": APP_ID})
    with pytest.raises(ConfigError, match="not both"):
        make_settings(
            github={
                "token": "t",
                "app_id": APP_ID,
                "app_installation_id": 1,
                "app_private_key": "k",
            }
        )
