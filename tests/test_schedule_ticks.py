"""Schedule ticks as pure functions of an injected "now": intervals, cron, daylight saving,
and the definition checks of ``wf.schedule(...)``."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone import _ticks

BERLIN = "Europe/Berlin"  # 2026: clocks jump 02:00 -> 03:00 on March 29, 03:00 -> 02:00 on Oct 25


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def cron(expr: str, timezone: str = "UTC") -> _ticks.Spec:
    return _ticks.Spec(cron=expr, every=None, timezone=timezone)


def every(seconds: int) -> _ticks.Spec:
    return _ticks.Spec(cron=None, every=timedelta(seconds=seconds), timezone="UTC")


def test_interval_ticks_are_multiples_of_the_interval_since_the_epoch() -> None:
    ticks = _ticks.latest(every(3600), utc(2026, 1, 1, 0, 30), utc(2026, 1, 1, 5, 10), 10)
    assert ticks == [utc(2026, 1, 1, h) for h in range(1, 6)]


def test_latest_keeps_only_the_most_recent_ticks_up_to_the_count() -> None:
    after, now = utc(2026, 1, 1, 0, 0), utc(2026, 1, 1, 0, 0, 10, 500000)
    assert _ticks.latest(every(1), after, now, 1) == [utc(2026, 1, 1, 0, 0, 10)]
    assert _ticks.latest(every(1), after, now, 3) == [utc(2026, 1, 1, 0, 0, s) for s in (8, 9, 10)]


def test_a_tick_equal_to_after_is_not_due_again_and_one_equal_to_now_is() -> None:
    tick = utc(2026, 1, 1, 12)
    assert _ticks.latest(every(3600), tick, tick + timedelta(minutes=59), 5) == []
    assert _ticks.latest(every(3600), tick, tick + timedelta(hours=1), 5) == [
        tick + timedelta(hours=1)
    ]
    assert _ticks.latest(cron("0 * * * *"), tick, tick + timedelta(hours=1), 5) == [
        tick + timedelta(hours=1)
    ]


def test_cron_ticks_are_read_in_the_schedules_time_zone() -> None:
    # 03:00 in Berlin is 02:00 UTC in winter.
    ticks = _ticks.latest(cron("0 3 * * *", BERLIN), utc(2026, 1, 1), utc(2026, 1, 3, 12), 5)
    assert ticks == [utc(2026, 1, 1, 2), utc(2026, 1, 2, 2), utc(2026, 1, 3, 2)]


def test_cron_with_a_seconds_field_first() -> None:
    ticks = _ticks.latest(cron("*/20 * * * * *"), utc(2026, 1, 1), utc(2026, 1, 1, 0, 1), 10)
    assert ticks == [utc(2026, 1, 1, 0, 0, s) for s in (20, 40)] + [utc(2026, 1, 1, 0, 1)]


def test_dst_skipped_hour_a_fixed_time_inside_it_fires_once_right_after_the_jump() -> None:
    # 02:30 does not exist in Berlin on 2026-03-29: cronsim (like Debian's cron) runs it
    # at 03:00 local, 01:00 UTC; the days around keep 02:30 local.
    ticks = _ticks.latest(
        cron("30 2 * * *", BERLIN), utc(2026, 3, 27, 12), utc(2026, 3, 30, 12), 10
    )
    assert ticks == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]


def test_dst_skipped_hour_an_hourly_schedule_has_no_tick_in_it() -> None:
    ticks = _ticks.latest(
        cron("0 * * * *", BERLIN), utc(2026, 3, 28, 23, 30), utc(2026, 3, 29, 2, 30), 10
    )
    # 00:00 (+01), 01:00 (+01), then 03:00 (+02): the hour 02:00 does not exist.
    assert ticks == [utc(2026, 3, 29, 0), utc(2026, 3, 29, 1), utc(2026, 3, 29, 2)]
    assert _ticks.following(cron("0 * * * *", BERLIN), utc(2026, 3, 29, 0, 30)) == utc(
        2026, 3, 29, 1
    )


def test_dst_repeated_hour_a_fixed_time_inside_it_fires_once() -> None:
    # 02:30 happens twice in Berlin on 2026-10-25 (00:30 and 01:30 UTC): it fires once,
    # at the first.
    ticks = _ticks.latest(
        cron("30 2 * * *", BERLIN), utc(2026, 10, 24, 12), utc(2026, 10, 25, 12), 10
    )
    assert ticks == [utc(2026, 10, 25, 0, 30)]
    assert _ticks.following(cron("30 2 * * *", BERLIN), utc(2026, 10, 25, 0, 30)) == utc(
        2026, 10, 26, 1, 30
    )


def test_dst_repeated_hour_an_hourly_schedule_fires_in_both_copies() -> None:
    ticks = _ticks.latest(
        cron("0 * * * *", BERLIN), utc(2026, 10, 24, 22, 30), utc(2026, 10, 25, 2, 30), 10
    )
    # 01:00 (+02), 02:00 (+02), 02:00 (+01), 03:00 (+01): four distinct UTC instants.
    assert ticks == [
        utc(2026, 10, 24, 23),
        utc(2026, 10, 25, 0),
        utc(2026, 10, 25, 1),
        utc(2026, 10, 25, 2),
    ]
    keys = {_ticks.key("hourly", t) for t in ticks}
    assert len(keys) == 4


def test_intervals_ignore_daylight_saving() -> None:
    ticks = _ticks.latest(every(3600), utc(2026, 10, 24, 23, 30), utc(2026, 10, 25, 2, 30), 10)
    assert ticks == [utc(2026, 10, 25, h) for h in (0, 1, 2)]


def test_following_is_strictly_after() -> None:
    assert _ticks.following(every(60), utc(2026, 1, 1, 0, 1)) == utc(2026, 1, 1, 0, 2)
    assert _ticks.following(every(60), utc(2026, 1, 1, 0, 1, 30)) == utc(2026, 1, 1, 0, 2)
    assert _ticks.following(cron("*/5 * * * *"), utc(2026, 1, 1, 0, 5)) == utc(2026, 1, 1, 0, 10)


def test_tick_keys_are_the_tick_in_utc_iso_8601() -> None:
    local = datetime(2026, 7, 1, 3, 0, tzinfo=_ticks.Spec(None, None, BERLIN).zone)
    assert _ticks.key("nightly", local) == "schedule:nightly:2026-07-01T01:00:00Z"


# -- definitions ----------------------------------------------------------------------


def wf(name: str = "reports") -> cyclone.Workflow[Any]:
    workflow: cyclone.Workflow[Any] = cyclone.Workflow(name, input=dict)
    workflow.step()(lambda ctx, value: None)
    return workflow


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of cron= and every="),
        ({"cron": "0 * * * *", "every": timedelta(hours=1)}, "exactly one of"),
        ({"cron": "61 * * * *"}, "bad cron expression"),
        ({"cron": "0 * * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"every": timedelta(milliseconds=500)}, "whole number of seconds"),
        ({"every": 60}, "every= takes a timedelta"),
        # The next tick of a longer interval falls after year 9999: the worker's scheduler
        # failed with OverflowError every second, for ever.
        ({"every": timedelta(days=365_251)}, "every= is at most 365250 days"),
        ({"every": timedelta(days=10**8)}, "every= is at most"),
        # zoneinfo opens a name as a file: a folder of zones or a name too long for the
        # file system raised OSError, not a DefinitionError.
        ({"every": timedelta(1), "timezone": "America"}, "unknown time zone"),
        ({"every": timedelta(1), "timezone": "a" * 300}, "unknown time zone"),
        ({"every": timedelta(1), "missed": "all"}, "missed="),
        ({"every": timedelta(1), "missed": "catch_up", "max_catch_up": 0}, "max_catch_up"),
        # cyclone_schedules.max_catch_up is an integer: a larger value failed in the worker.
        ({"every": timedelta(1), "max_catch_up": 2**31}, "max_catch_up= must be an int from 1"),
    ],
)
def test_a_bad_schedule_is_a_definition_error(options: dict[str, Any], message: str) -> None:
    workflow = wf()
    with pytest.raises(cyclone.DefinitionError, match=message):
        workflow.schedule("s", input={}, **options)
    assert workflow.schedules == {}


def test_a_schedule_name_is_a_key_part() -> None:
    with pytest.raises(cyclone.DefinitionError, match="without ':'"):
        wf().schedule("a:b", every=timedelta(1), input={})
    with pytest.raises(cyclone.DefinitionError, match="key rules"):
        wf().schedule("x" * 250, every=timedelta(1), input={})


def test_a_fixed_input_that_does_not_encode_fails_at_definition() -> None:
    with pytest.raises(cyclone.InputError):
        wf().schedule("s", every=timedelta(1), input=object())


def test_a_schedule_defined_twice_on_a_workflow_is_an_error() -> None:
    workflow = wf()
    workflow.schedule("s", every=timedelta(1), input={})
    with pytest.raises(cyclone.DefinitionError, match="defined twice"):
        workflow.schedule("s", every=timedelta(2), input={})


def test_two_workflows_with_one_schedule_name_cannot_share_a_worker() -> None:
    a, b = wf("a"), wf("b")
    a.schedule("s", every=timedelta(1), input={})
    b.schedule("s", every=timedelta(1), input={})
    with pytest.raises(cyclone.DefinitionError, match="schedule names are global"):
        cyclone.Worker(
            sa.create_engine("postgresql+psycopg://nobody@localhost/none"), workflows=[a, b]
        )


def test_cron_without_the_cron_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cronsim", None)
    with pytest.raises(cyclone.DefinitionError, match=r"cyclone\[cron\]"):
        wf().schedule("s", cron="0 * * * *", input={})
    wf().schedule("s", every=timedelta(hours=1), input={})  # intervals need no extra


def test_an_input_callable_gets_the_tick_in_the_schedules_zone() -> None:
    seen: list[datetime] = []

    def build(tick: datetime) -> dict[str, str]:
        seen.append(tick)
        return {"day": tick.date().isoformat()}

    schedule = wf().schedule("s", cron="0 0 * * *", input=build, timezone=BERLIN)
    assert schedule.input_for(utc(2026, 6, 30, 22)) == {"day": "2026-07-01"}
    assert seen[0].utcoffset() == timedelta(hours=2)


# -- the repeated hour, seen from inside it -------------------------------------------
#
# cronsim reads a start inside the repeated hour by its wall-clock time: from the second
# 01:10 in New York (06:10 UTC) a fixed-time schedule's next 01:30 was the first one,
# 05:30 UTC, in the past (a worker slept 0 s and looked again, for the whole hour), and
# its reverse iteration skipped the second copy's ticks of an hourly or */15 schedule
# (never fired). Each case is checked against the ticks cronsim gives from before the
# transition, looking every 5 minutes through the night.

NEW_YORK = "America/New_York"  # 2026: 02:00 -> 01:00 on Nov 1 (06:00 UTC)


def _from_before(spec: _ticks.Spec, start: datetime, end: datetime) -> list[datetime]:
    """The ticks in ``(start, end]`` as cronsim iterates them from ``start`` (outside DST)."""
    import cronsim

    found: list[datetime] = []
    for tick in cronsim.CronSim(spec.cron or "", start.astimezone(spec.zone)):
        if tick.astimezone(UTC) > end:
            return found
        found.append(tick.astimezone(UTC))
    return found


@pytest.mark.parametrize("timezone", [BERLIN, NEW_YORK])
@pytest.mark.parametrize(
    "expr",
    [
        "30 1 * * *",
        "30 2 * * *",
        "45 1 * * *",
        "15 1,2 * * *",
        "0 * * * *",
        "30 * * * *",
        "*/15 * * * *",
        "*/20 1 * * *",
        "0 */2 * * *",
        "0 30 1 * * *",
    ],
)
def test_dst_repeated_hour_every_tick_is_found_from_inside_it(timezone: str, expr: str) -> None:
    spec = cron(expr, timezone)
    night = utc(2026, 10, 24, 20) if timezone == BERLIN else utc(2026, 11, 1, 2)
    end = night + timedelta(hours=10)
    ticks = _from_before(spec, night - timedelta(days=1), end + timedelta(days=2))
    now = night
    while now <= end:
        assert _ticks.latest(spec, night, now, 1000) == [t for t in ticks if night < t <= now]
        assert _ticks.following(spec, now) == next(t for t in ticks if t > now)
        now += timedelta(minutes=5)


def test_dst_repeated_hour_a_fixed_time_schedule_is_not_due_again_in_the_second_copy() -> None:
    # 01:30 in New York on 2026-11-01 is 05:30 UTC (EDT), then 06:30 UTC (EST): it fires
    # once, at the first, and from inside the second copy its next tick is the next day.
    spec = cron("30 1 * * *", NEW_YORK)
    assert _ticks.latest(spec, utc(2026, 11, 1), utc(2026, 11, 1, 6, 40), 5) == [
        utc(2026, 11, 1, 5, 30)
    ]
    assert _ticks.following(spec, utc(2026, 11, 1, 6, 10)) == utc(2026, 11, 2, 6, 30)


def test_dst_repeated_hour_an_hourly_schedule_is_found_in_the_second_copy() -> None:
    spec = cron("0 * * * *", BERLIN)
    # 01:00 UTC is 02:00 CET, the second 02:00: it is due at once.
    assert _ticks.latest(spec, utc(2026, 10, 25, 0), utc(2026, 10, 25, 1, 0, 0, 5000), 5) == [
        utc(2026, 10, 25, 1)
    ]


def test_latest_of_a_dense_cron_after_long_downtime_is_bounded_and_exact() -> None:
    spec = cron("* * * * * *", BERLIN)  # every second, a week down
    now = utc(2026, 10, 25, 1, 0, 30)
    ticks = _ticks.latest(spec, now - timedelta(days=7), now, 3)
    assert ticks == [now - timedelta(seconds=2), now - timedelta(seconds=1), now]
    sparse = cron("0 0 1 1 *")  # yearly, ten years down
    assert _ticks.latest(sparse, utc(2016, 6, 1), utc(2026, 6, 1), 3) == [
        utc(2024, 1, 1),
        utc(2025, 1, 1),
        utc(2026, 1, 1),
    ]
    assert _ticks.latest(sparse, utc(2025, 6, 1), utc(2026, 6, 1), 3) == [utc(2026, 1, 1)]
