"""The sensors that post failures to the streams file's webhook (`notifications:`): one on run
failure, one on the failed checks of runs that succeeded (a non-blocking check that fails does
not fail its run). They gather Dagster's facts; the words are `jobs.ops.notifications`', the
post is `resources.webhook`'s, and neither ever raises into the sensor loop."""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from jobs.ops.notifications import (
    FailedCheck,
    check_failure_text,
    run_failure_text,
    stream_of,
    to_report,
)
from resources.webhook import post_text
from tidemark.config import Notifications
from tidemark.errors import WebhookUrlUnset

RUN_FAILURE_SENSOR = "tidemark_run_failure_webhook"
CHECK_FAILURE_SENSOR = "tidemark_check_failure_webhook"


def _post(context: dg.RunStatusSensorContext, notifications: Notifications, text: str) -> None:
    try:
        url = notifications.resolved_webhook_url()
    except WebhookUrlUnset as exc:
        context.log.warning(f"tidemark: {exc}")
        return
    if not post_text(url, text, timeout=notifications.timeout_seconds):
        context.log.warning("tidemark: the failure notification was not delivered (see above).")


def _step_error(context: dg.RunFailureSensorContext) -> str | None:
    for event in context.get_step_failure_events():
        error = getattr(event.event_specific_data, "error", None)
        # Dagster wraps the op's exception ("Error occurred while executing op ..."): the
        # innermost cause is the one that says what went wrong.
        while error is not None and error.cause is not None:
            error = error.cause
        if error is not None:
            return error.message
    return context.failure_event.message


def _failed_checks(instance: dg.DagsterInstance, run_id: str) -> list[FailedCheck]:
    found = []
    for record in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
        evaluation = record.dagster_event.event_specific_data if record.dagster_event else None
        if evaluation is None or evaluation.passed:
            continue
        severity = "error" if evaluation.severity == dg.AssetCheckSeverity.ERROR else "warn"
        found.append(
            FailedCheck(
                tuple(evaluation.asset_key.path),
                evaluation.check_name,
                severity,
                evaluation.description,
            )
        )
    return found


def notification_sensors(
    notifications: Notifications | None, streams: Sequence[str]
) -> list[dg.SensorDefinition]:
    """The two sensors, on by default; none without a `notifications:` section."""
    if notifications is None:
        return []

    @dg.run_failure_sensor(name=RUN_FAILURE_SENSOR, default_status=dg.DefaultSensorStatus.RUNNING)
    def run_failed(context: dg.RunFailureSensorContext) -> None:
        """Posts a failed run to the webhook."""
        run = context.dagster_run
        stream = stream_of(streams, job=run.job_name)
        text = run_failure_text(
            run.job_name, run.run_id, _step_error(context), stream, notifications.ui_url
        )
        _post(context, notifications, text)

    @dg.run_status_sensor(
        name=CHECK_FAILURE_SENSOR,
        run_status=dg.DagsterRunStatus.SUCCESS,
        default_status=dg.DefaultSensorStatus.RUNNING,
    )
    def checks_failed(context: dg.RunStatusSensorContext) -> None:
        """Posts the failed checks of a run that succeeded to the webhook."""
        run = context.dagster_run
        failed = to_report(
            _failed_checks(context.instance, run.run_id), notifications.check_severity
        )
        if not failed:
            return
        stream = stream_of(streams, job=run.job_name, asset_path=failed[0].asset_path)
        text = check_failure_text(failed, run.job_name, run.run_id, stream, notifications.ui_url)
        _post(context, notifications, text)

    return [run_failed, checks_failed]
