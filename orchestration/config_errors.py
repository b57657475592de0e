"""Where an operator sees a broken entry of the streams file in Dagster: the valid streams load
as usual, and each broken one gets an asset of its own (`<key>/config`, its description the
error), a check on it that fails with the one-paragraph message, and a sensor, on by default,
that records that failure without a run and shows the message on every tick. A valid entry
whose Dagster definitions fail to build (`StreamNotLoaded`) is reported the same way.

A streams file that is unusable as a whole (not YAML, no `streams` list) is reported the same
way under the key `streams_file`, so the code location loads with no traceback either way.
"""

from __future__ import annotations

import hashlib

import dagster as dg

from tidemark.config import BrokenStream

CHECK_NAME = "config_valid"
WHOLE_FILE = "streams_file"


def config_asset_key(broken: BrokenStream) -> dg.AssetKey:
    return dg.AssetKey([broken.key, "config"])


def sensor_name(broken: BrokenStream) -> str:
    return f"{broken.key}_config_error"


def _evaluation(broken: BrokenStream) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(
        asset_key=config_asset_key(broken),
        check_name=CHECK_NAME,
        passed=False,
        severity=dg.AssetCheckSeverity.ERROR,
        description=str(broken.error),
        metadata={"entry": broken.index, "problem": broken.error.problem, "fix": broken.error.fix},
    )


def config_error_definitions(
    broken: BrokenStream,
) -> tuple[dg.AssetSpec, dg.AssetChecksDefinition, dg.SensorDefinition]:
    """The asset, check and sensor that report one broken entry (or the whole file)."""
    what = "The streams file" if broken.key == WHOLE_FILE else f"Stream {broken.key!r}"
    spec = dg.AssetSpec(
        config_asset_key(broken),
        group_name=broken.key,
        description=f"{what} is not loaded: {broken.error}",
    )

    @dg.asset_check(asset=spec.key, name=CHECK_NAME, blocking=False)
    def config_valid() -> dg.AssetCheckResult:
        """The stream's entry validates and its definitions load (they do not: the message
        says why and what to do, then reload the code location)."""
        evaluation = _evaluation(broken)
        return dg.AssetCheckResult(
            passed=False,
            severity=evaluation.severity,
            description=evaluation.description,
            metadata=evaluation.metadata,
        )

    # One recorded failure per distinct message: the tick's skip reason repeats it.
    fingerprint = hashlib.sha256(str(broken.error).encode()).hexdigest()[:16]

    @dg.sensor(
        name=sensor_name(broken),
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"{what} is not loaded; this sensor says why.",
    )
    def config_error(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        events = [] if context.cursor == fingerprint else [_evaluation(broken)]
        return dg.SensorResult(
            skip_reason=str(broken.error), cursor=fingerprint, asset_events=events
        )

    return spec, config_valid, config_error
