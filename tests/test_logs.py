"""Logs: an idle broker is quiet, JSON lines carry the structured fields, bars stay clear."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from github_broker import logs
from github_broker.settings import Settings
from tests.processes import BrokerProcess, broker_env
from tests.waiting import wait_until
from tests.world import ONE_ISSUE, running_world, simulated


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    logs.flush()
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)
    logging.getLogger("apscheduler").setLevel(logging.NOTSET)


@pytest.mark.slow
def test_idle_serve_polls_without_logging_a_line(redis_url: str, tmp_path: Path) -> None:
    with simulated(ONE_ISSUE) as sim:
        # A generous leader TTL: a loaded test machine must not make leadership flap (and log).
        env = broker_env(
            redis_url, sim.base_url, "acme/widgets", GITHUB_BROKER_POLL__LEADER_TTL_S="30"
        )
        broker = BrokerProcess(env, tmp_path, "b")
        broker.start()
        try:
            # Start-up and the first (changing) sync may log; wait until that settled.
            wait_until(
                lambda: "full pass" in broker.log_path.read_text(),
                20,
                "a full pass in the broker's log",
            )
            time.sleep(1.5)
            before = broker.log_path.read_text().splitlines()
            calls_before = sim.stats.snapshot()["total"]
            idle_s = 8.0
            time.sleep(idle_s)
            after = broker.log_path.read_text().splitlines()
            passes = sim.stats.snapshot()["total"] - calls_before
        finally:
            broker.stop()
    assert passes >= 4, "the poller did not poll while idle"
    new = after[len(before) :]
    # Below one line a minute: over 8 s of idle polling, not a single line.
    assert new == [], new
    assert not any("Running job" in line for line in after)


def test_apscheduler_is_quiet_unless_debug(restore_logging: None) -> None:
    logs.configure("INFO")
    assert logging.getLogger("apscheduler").getEffectiveLevel() == logging.WARNING
    logs.configure("DEBUG")
    assert logging.getLogger("apscheduler").getEffectiveLevel() == logging.DEBUG


async def _claim_twice(redis_url: str, make_settings: Callable[..., Settings]) -> None:
    with simulated(ONE_ISSUE) as sim:
        async with running_world(sim, redis_url, make_settings) as world:
            await world.tick()
            first = await world.ask("a1")
            assert first is not None
            # The next request settles the held task: an implicit completion.
            await world.ask("a1")
    logs.flush()


@pytest.mark.anyio
async def test_no_info_line_per_claim(
    redis_url: str,
    make_settings: Callable[..., Settings],
    capsys: pytest.CaptureFixture[str],
    restore_logging: None,
) -> None:
    """Claims and implicit completions come at an agent fleet's pace: DEBUG, not INFO."""
    logs.configure("INFO", "json")
    await _claim_twice(redis_url, make_settings)
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert lines, "INFO logging wrote nothing at all"
    assert not [x for x in lines if x["message"].startswith("claimed")]
    assert not [x for x in lines if "settled by its next request" in x["message"]]
    synced = next(x for x in lines if x["message"].startswith("sync "))
    assert synced["repository"] == "acme/widgets"


@pytest.mark.anyio
async def test_json_lines_name_repository_issue_agent_and_task(
    redis_url: str,
    make_settings: Callable[..., Settings],
    capsys: pytest.CaptureFixture[str],
    restore_logging: None,
) -> None:
    logs.configure("DEBUG", "json")
    await _claim_twice(redis_url, make_settings)
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    claimed = next(x for x in lines if x["message"].startswith("claimed"))
    assert claimed["level"] == "DEBUG" and claimed["logger"] == "github_broker.claim.walk"
    assert claimed["repository"] == "acme/widgets" and claimed["issue"] == 1
    assert claimed["agent"] == "a1" and claimed["task"] == "development:1"
    settled = next(x for x in lines if "settled by its next request" in x["message"])
    assert settled["issue"] == 1 and settled["agent"] == "a1"
    assert settled["message"].startswith("needs_review") or "completed" in settled["message"]


def test_exceptions_survive_the_queue(
    capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    logs.configure("INFO", "json")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("github_broker.test").exception("failed %s", "here")
    logs.flush()
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["message"] == "failed here"
    assert "ValueError: boom" in line["exception"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_shows_total_and_eta_and_log_lines_stay_clear(
    monkeypatch: pytest.MonkeyPatch, restore_logging: None
) -> None:
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    logs.configure("INFO", "text")
    with logs.progress_bar(200, "acme/widgets") as bar:
        bar.update(100)
        logging.getLogger("github_broker.leader.sync").info("a line while the bar runs")
        logs.flush()
        bar.update(100)
    out = term.getvalue()
    assert "/200" in out and "<" in out  # total and ETA ([elapsed<remaining])
    # The log line is printed on a line of its own, not glued to the bar.
    line = next(x for x in out.replace("\r", "\n").splitlines() if "a line while" in x)
    assert line.endswith("github_broker.leader.sync: a line while the bar runs")
    assert "acme/widgets" not in line


def test_progress_bar_is_silent_without_a_terminal(
    monkeypatch: pytest.MonkeyPatch, restore_logging: None
) -> None:
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    with logs.progress_bar(10, "acme/widgets") as bar:
        bar.update(10)
    assert out.getvalue() == ""


@pytest.mark.anyio
async def test_a_refused_github_write_is_logged_with_its_issue(
    redis_url: str,
    make_settings: Callable[..., Settings],
    capsys: pytest.CaptureFixture[str],
    restore_logging: None,
) -> None:
    logs.configure("INFO", "json")
    with simulated(ONE_ISSUE) as sim:
        async with running_world(sim, redis_url, make_settings) as world:
            await world.tick()
            assert await world.ask("a1") is not None
            sim.faults.add_error(422, method="POST", path=r"/issues/1/labels$")
            await world.daemon.drain_all()
    logs.flush()
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    refused = [x for x in lines if x["message"].startswith("GitHub refused labels:1")]
    assert len(refused) == 1, lines
    assert refused[0]["level"] == "WARNING" and "retry in" in refused[0]["message"]
    assert refused[0]["repository"] == "acme/widgets" and refused[0]["issue"] == 1
