"""Failure notifications: Dagster's real instance runs a job that fails (or whose check fails),
the sensor is evaluated on it, and a real HTTP receiver on loopback shows what was posted."""

from __future__ import annotations

import logging
from pathlib import Path

import dagster as dg
import pytest

from orchestration.notifications import notification_sensors
from resources.webhook import post_text
from tests.helpers.webhook_receiver import webhook_receiver
from tidemark.config import Notifications, load_config, load_streams
from tidemark.errors import ConfigError, TidemarkError, WebhookUrlUnset

pytestmark = pytest.mark.fast

HOOK_ENV = "TIDEMARK_TEST_WEBHOOK_URL"
UI = "http://dagster.example:3000"


def _sensors(notifications: Notifications) -> dict[str, dg.SensorDefinition]:
    return {s.name: s for s in notification_sensors(notifications, ["orders", "orders_eu"])}


@dg.op
def drain_op() -> None:
    raise TidemarkError(
        "The drain of stream 'orders' broke on purpose.\nA second line the message leaves out.",
        "Nothing to fix: a test.",
    )


@dg.job(name="orders_drain")
def failing_job() -> None:
    drain_op()


def _status_context(
    sensor: dg.SensorDefinition,
    instance: dg.DagsterInstance,
    result: dg.ExecuteInProcessResult,
    event: dg.DagsterEvent,
) -> dg.RunStatusSensorContext:
    """What the daemon would hand `sensor` for `result`'s run, at `event`."""
    return dg.build_run_status_sensor_context(
        sensor_name=sensor.name,
        dagster_event=event,
        dagster_instance=instance,
        dagster_run=result.dagster_run,
    )


def _failed_run(instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    result = failing_job.execute_in_process(instance=instance, raise_on_error=False)
    assert not result.success
    return result


def test_a_failed_run_is_posted_naming_stream_job_error_and_link(monkeypatch):
    with webhook_receiver() as receiver, dg.instance_for_test() as instance:
        monkeypatch.setenv(HOOK_ENV, receiver.url)
        notifications = Notifications(webhook_url=f"${{{HOOK_ENV}}}", ui_url=UI + "/")
        result = _failed_run(instance)
        sensor = _sensors(notifications)["tidemark_run_failure_webhook"]
        context = _status_context(
            sensor, instance, result, result.get_run_failure_event()
        ).for_run_failure()
        sensor(context)
    [(path, body)] = receiver.posts
    assert path == "/services/T000/B000/hook-secret" and set(body) == {"text"}
    text = body["text"]
    run_id = result.dagster_run.run_id
    assert text.startswith("Tidemark stream orders: run ")
    assert "job orders_drain failed" in text
    assert "failed: TidemarkError: The drain of stream 'orders' broke on purpose." in text
    assert "second line" not in text and "\n" not in text
    assert text.endswith(f"{UI}/runs/{run_id}")


class _Checks:
    """An asset of stream `orders` with three checks: one passes, one fails WARN, one ERROR."""

    @staticmethod
    def definitions() -> list:
        key = dg.AssetKey(["orders", "raw_changes"])

        @dg.asset(key=key)
        def raw_changes() -> None:
            return None

        @dg.asset_check(asset=key, name="lag")
        def lag() -> dg.AssetCheckResult:
            return dg.AssetCheckResult(
                passed=False,
                severity=dg.AssetCheckSeverity.ERROR,
                description="lag 7200 s is above 3600 s\nsecond line",
            )

        @dg.asset_check(asset=key, name="oplog_headroom")
        def headroom() -> dg.AssetCheckResult:
            return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN)

        @dg.asset_check(asset=key, name="uncommitted_files")
        def files() -> dg.AssetCheckResult:
            return dg.AssetCheckResult(passed=True)

        return [raw_changes, lag, headroom, files]


def _run_with_checks(instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    result = dg.materialize(_Checks.definitions(), instance=instance)
    assert result.success  # non-blocking checks fail without failing the run
    return result


@pytest.mark.parametrize("least", ["error", "warn"])
def test_failed_checks_of_a_successful_run_are_posted(monkeypatch, least):
    with webhook_receiver() as receiver, dg.instance_for_test() as instance:
        notifications = Notifications(webhook_url=receiver.url, check_severity=least)
        result = _run_with_checks(instance)
        sensor = _sensors(notifications)["tidemark_check_failure_webhook"]
        context = _status_context(sensor, instance, result, result.get_run_success_event())
        sensor(context)
    [text] = receiver.texts()
    assert text.startswith("Tidemark stream orders: check")
    assert "lag on orders/raw_changes (ERROR: lag 7200 s is above 3600 s)" in text
    assert "second line" not in text and "uncommitted_files" not in text
    assert ("oplog_headroom on orders/raw_changes (WARN)" in text) == (least == "warn")
    assert f"(run id {result.dagster_run.run_id})" in text  # no ui_url: the id, no link


def test_a_run_whose_checks_pass_posts_nothing():
    with webhook_receiver() as receiver, dg.instance_for_test() as instance:
        result = _failed_run(instance)  # a failed run has no check evaluations at all
        sensor = _sensors(Notifications(webhook_url=receiver.url))["tidemark_check_failure_webhook"]
        sensor(_status_context(sensor, instance, result, result.get_run_failure_event()))
    assert receiver.posts == []


def test_an_unset_variable_or_a_dead_receiver_is_a_warning_never_an_exception(monkeypatch, caplog):
    monkeypatch.delenv(HOOK_ENV, raising=False)
    with dg.instance_for_test() as instance:
        result = _failed_run(instance)
        sensor = _sensors(Notifications(webhook_url=f"${{{HOOK_ENV}}}"))[
            "tidemark_run_failure_webhook"
        ]
        context = _status_context(
            sensor, instance, result, result.get_run_failure_event()
        ).for_run_failure()
        sensor(context)  # must not raise
        with webhook_receiver() as receiver:
            dead = receiver.url  # the receiver is gone once the block ends
        monkeypatch.setenv(HOOK_ENV, dead)
        with caplog.at_level(logging.WARNING, logger="tidemark.notifications"):
            sensor(context)  # must not raise either
    assert "hook-secret" not in caplog.text and "127.0.0.1" in caplog.text
    assert "attempt 2 of 2" in caplog.text


def test_a_post_is_retried_once_and_the_url_is_never_logged(caplog):
    with webhook_receiver() as receiver, caplog.at_level(logging.WARNING):
        receiver.statuses = [503]
        assert post_text(receiver.url, "first try fails", pause=0)
        receiver.statuses = [500, 502]
        assert not post_text(receiver.url, "both fail", pause=0)
    assert receiver.texts() == ["first try fails"] * 2 + ["both fail"] * 2
    assert "HTTP 503" in caplog.text and "HTTP 502" in caplog.text
    assert "hook-secret" not in caplog.text


# -- the streams file's section --------------------------------------------------------------

STREAM = "streams:\n  - {name: orders, database: shop, collection: orders}\n"


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "streams.yaml"
    path.write_text(text)
    return path


def test_the_section_loads_with_a_variable_reference(tmp_path, monkeypatch):
    path = _file(
        tmp_path,
        STREAM + "notifications:\n  webhook_url: ${TIDEMARK_WEBHOOK_URL}\n  ui_url: " + UI + "\n",
    )
    for loaded in (load_config(path), load_streams(path).config()):
        assert loaded.notifications is not None
        assert loaded.notifications.ui_url == UI
    section = load_streams(path).notifications
    assert section is not None
    with pytest.raises(WebhookUrlUnset, match="TIDEMARK_WEBHOOK_URL"):
        section.resolved_webhook_url({})
    with pytest.raises(WebhookUrlUnset, match="not an http"):
        section.resolved_webhook_url({"TIDEMARK_WEBHOOK_URL": "hooks.example/x"})
    url = "https://hooks.example/services/x"
    assert section.resolved_webhook_url({"TIDEMARK_WEBHOOK_URL": url}) == url
    assert load_config(_file(tmp_path, STREAM)).notifications is None


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ("  webhook_url: hooks.example/services/secret-token\n", "must be an http(s)://"),
        ("  webhook_url: https://hooks.example/x\n  channel: ops\n", "unknown key"),
        ("  ui_url: " + UI + "\n", "webhook_url: Field required"),
        ("  webhook_url: https://h.example/x\n  check_severity: info\n", "check_severity"),
    ],
)
def test_a_bad_section_is_a_config_error_with_its_fix(tmp_path, section, expected):
    path = _file(tmp_path, STREAM + "notifications:\n" + section)
    for load in (load_config, load_streams):
        with pytest.raises(ConfigError) as refused:
            load(path)
        message = str(refused.value)
        assert "notifications" in message and expected in message
        assert "secret-token" not in message  # the value may be the credential itself
        assert "Fix the file" in message


def test_a_broken_stream_leaves_the_section_in_force(tmp_path):
    """Entry-by-entry loading (the code location's): one stream with a typo still posts the
    others' failures."""
    path = _file(
        tmp_path,
        STREAM
        + "  - {name: typo, database: shop, colection: x}\n"
        + "notifications:\n  webhook_url: https://hooks.example/x\n",
    )
    loaded = load_streams(path)
    assert [b.key for b in loaded.broken] == ["typo"]
    notifications = loaded.config().notifications
    assert notifications is not None
    assert notifications.webhook_url == "https://hooks.example/x"


def test_the_code_location_has_the_sensors_only_with_the_section(tmp_path, monkeypatch):
    from orchestration.definitions import location_definitions

    monkeypatch.setenv("TIDEMARK_STATE_URL", f"sqlite:///{tmp_path / 'state.db'}")
    monkeypatch.setenv("TIDEMARK_HOME", str(tmp_path / "home"))
    names = {"tidemark_run_failure_webhook", "tidemark_check_failure_webhook"}

    def sensors(text: str) -> set[str]:
        defs = location_definitions(_file(tmp_path, text))
        return {s.name for s in defs.sensors or []}

    assert names <= sensors(STREAM + "notifications:\n  webhook_url: https://hooks.example/x\n")
    assert not names & sensors(STREAM)
