"""The rows of the scale run (a topology and what happens to its job), each row's figures and
verdict, and the table they make."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.scale.cutoff import CUT_SECONDS

# What the sandbox enforces: 2,000 calls take 40 s at this rate, enough to see a pace, and the
# rows fit in under ten minutes.
LIMIT = 50.0
# ratejobs' limit for the API is the sandbox's, with a burst of 2.
API_BURST = 2
# The sandbox's burst: as faults.chaos, a quarter second of calls for the jitter of a loaded
# 2-core machine (requests sent at their slots and delivered late, beside the next ones). A
# burst of 5 (3 beyond the API's) gave 2 429s in one of four runs at a load average of 4 to 5.
SANDBOX_BURST = int(LIMIT * 0.25)
# A row without a fault passes at or above this share of the limit (arrivals per second over
# the job); a fault's row is judged by its recovery instead.
PACE_FLOOR = 0.95
# How far off each worker host's wall clock is, in the skewed rows.
SKEW_SECONDS = 30.0
SKEWED = (SKEW_SECONDS, -SKEW_SECONDS)
# Enough calls for a pace, few enough that the row is about its start.
NOT_BEFORE_CALLS = 250
NOT_BEFORE_SECONDS = 3.0
# A job starts within this of being due: a dispatch wake-up (timed on the asking process's
# monotonic clock) fires on time, then a dispatch run and a message.
START_SLACK_SECONDS = 2.0
# With min_replicas, a master refuses writes once its replica has not acknowledged for this
# many seconds (Redis's default is 10).
MIN_REPLICAS_MAX_LAG = 2
# The retry-after-skew row: for this long the sandbox admits this share of the limit, and
# answers the rest 429 with Retry-After as an HTTP-date (a moment, read on whose clock?).
THROTTLE_SECONDS = 10.0
THROTTLE_SHARE = 0.4
# The cluster-node-restart row: two APIs at half the limit each, as many calls each as take the
# other rows' 40 s, and one node of the Cluster down for longer than its node timeout (5 s),
# so the other nodes mark it failed.
NODE_RESTART_CALLS = 1_000
NODE_DOWN_SECONDS = 10.0
# The fault strikes once this share of the job is done (as in faults.chaos); the rows without
# one measure their recovery time from there too, the measure's own baseline.
FAULT_AT = 0.25


@dataclass(frozen=True)
class Scenario:
    name: str
    clocks: tuple[float, float]  # wall-clock offsets of worker hosts 1 and 2, seconds
    what: str
    # or "sentinel": 1 master, 1 replica, 3 sentinels; or "cluster": the limiters on a Redis
    # Cluster of 3 masters, the broker on the plain Redis
    redis: str = "plain"
    # The job's not_before, this long after its submission: its first calls then wait for a
    # dispatch wake-up, the only thing that starts them on time.
    start_in: float = 0.0
    calls: int | None = None  # None: --calls
    # at FAULT_AT: "failover" (SENTINEL FAILOVER, then the old master killed), "switchover"
    # (SENTINEL FAILOVER, the old master left running), "cut-off" (worker host 2 off the
    # network for CUT_SECONDS), "node-restart" (the Cluster node of the job's API killed and
    # started again NODE_DOWN_SECONDS later, while a second API's job runs on another node),
    # "pgbouncer-restart" (PgBouncer stopped and started again), "throttle" (the sandbox lets
    # through THROTTLE_SHARE of the limit for THROTTLE_SECONDS, its 429s carrying Retry-After
    # as an HTTP-date)
    fault: str | None = None
    database: str = "direct"  # or "pgbouncer": every process through PgBouncer, transaction mode
    # Run by `make scale` (and without --only); the others only when named.
    default: bool = True
    # Sentinel rows: the masters' min-replicas-to-write (0: Redis's default, off).
    min_replicas: int = 0

    @property
    def judges_pace(self) -> bool:
        """A fault's row is judged by its recovery, a not_before row by its start: over its
        few seconds of calls, one second lost on a busy machine moves the pace by a fifth."""
        return self.fault is None and not self.start_in

    @property
    def topology(self) -> str:
        first, second = self.clocks
        clocks = "±0 s" if not first and not second else f"{first:+g} s / {second:+g} s"
        redis = {
            "plain": "Redis",
            "sentinel": "Redis Sentinel (1+1, 3 sentinels)",
            "cluster": "Redis Cluster (3 masters; broker on a plain Redis)",
        }[self.redis]
        pooler = ", PgBouncer (transaction)" if self.database == "pgbouncer" else ""
        return f"2 worker hosts, clocks {clocks}, {redis}{pooler}"


NOT_BEFORE = f"not_before {NOT_BEFORE_SECONDS:g} s after submission"
SCENARIOS = {
    scenario.name: scenario
    for scenario in [
        Scenario("baseline", (0.0, 0.0), "no fault"),
        Scenario("baseline-skew", SKEWED, "no fault"),
        Scenario(
            "not-before",
            (0.0, 0.0),
            NOT_BEFORE,
            start_in=NOT_BEFORE_SECONDS,
            calls=NOT_BEFORE_CALLS,
        ),
        Scenario(
            "not-before-skew",
            SKEWED,
            NOT_BEFORE,
            start_in=NOT_BEFORE_SECONDS,
            calls=NOT_BEFORE_CALLS,
        ),
        Scenario(
            "retry-after-skew",
            SKEWED,
            f"once {FAULT_AT:.0%} of the calls are done, the sandbox admits {THROTTLE_SHARE:.0%} "
            f"of the limit for {THROTTLE_SECONDS:g} s and answers the rest 429 with Retry-After "
            "as an HTTP-date",
            fault="throttle",
        ),
        Scenario(
            "sentinel-failover",
            (0.0, 0.0),
            f"SENTINEL FAILOVER once {FAULT_AT:.0%} of the calls are done, then kill -9 of the "
            "old master",
            redis="sentinel",
            fault="failover",
        ),
        Scenario(
            "sentinel-switchover",
            (0.0, 0.0),
            f"SENTINEL FAILOVER once {FAULT_AT:.0%} of the calls are done, the old master "
            "left running",
            redis="sentinel",
            fault="switchover",
            default=False,
        ),
        Scenario(
            "sentinel-switchover-min-replicas",
            (0.0, 0.0),
            f"as sentinel-switchover, with min-replicas-to-write 1 and min-replicas-max-lag "
            f"{MIN_REPLICAS_MAX_LAG} on the masters",
            redis="sentinel",
            fault="switchover",
            default=False,
            min_replicas=1,
        ),
        Scenario(
            "worker-cut-off",
            (0.0, 0.0),
            f"worker host 2 off the network for {CUT_SECONDS:g} s once {FAULT_AT:.0%} of the "
            "calls are done",
            fault="cut-off",
        ),
        Scenario("redis-cluster", (0.0, 0.0), "no fault", redis="cluster"),
        Scenario(
            "cluster-node-restart",
            (0.0, 0.0),
            f"the job's API at {LIMIT / 2:g}/s and a second API at {LIMIT / 2:g}/s on another "
            f"node, each {NODE_RESTART_CALLS:,} calls; the first API's node killed once "
            f"{FAULT_AT:.0%} of its calls are done, started again {NODE_DOWN_SECONDS:g} s later",
            redis="cluster",
            calls=NODE_RESTART_CALLS,
            fault="node-restart",
        ),
        Scenario("pgbouncer", (0.0, 0.0), "no fault", database="pgbouncer"),
        Scenario(
            "pgbouncer-restart",
            (0.0, 0.0),
            f"PgBouncer restarted once {FAULT_AT:.0%} of the calls are done",
            database="pgbouncer",
            fault="pgbouncer-restart",
        ),
    ]  # fmt: skip
}


@dataclass
class Row:
    scenario: Scenario
    calls: int
    arrivals: int | None = None
    throttled: int = 0
    duplicates: int | None = None  # arrivals beyond one per call, replays included
    effective: int | None = None  # duplicates the sandbox acted on (not replayed by their key)
    pace: float | None = None  # admitted arrivals per second over LIMIT
    longest_gap: float | None = None  # between two admitted arrivals, seconds
    late_start: float | None = None  # first arrival after not_before (or the submission)
    recover: float | None = None
    job_seconds: float | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def result(self) -> str:
        return "pass" if not self.problems else "**FAIL**"


COLUMNS = ("topology", "scenario", "calls", "arrivals", "429s", "duplicates", "effective",
           f"pace (of {LIMIT:g}/s)", "longest gap", "late start", "recovery time", "job time",
           "result")  # fmt: skip


def render(rows: Sequence[Row], about: str) -> str:
    """The table, then the problems and notes of each row, then `about` (as faults.chaos)."""

    def cells(row: Row) -> list[str]:
        return [row.scenario.topology, row.scenario.name, f"{row.calls:,}", _n(row.arrivals),
                f"{row.throttled:,}", _n(row.duplicates), _n(row.effective), _f(row.pace, "{:.3f}"),
                _f(row.longest_gap, "{:.2f} s"), _f(row.late_start, "{:.2f} s"),
                _f(row.recover, "{:.1f} s"), _f(row.job_seconds, "{:.1f} s"),
                row.result]  # fmt: skip

    table = [COLUMNS, ("---", "---", *["--:"] * (len(COLUMNS) - 3), "---"), *map(cells, rows)]
    lines = ["| " + " | ".join(line) + " |" for line in table]
    lines += [""] + [
        f"- {row.scenario.name}: {text}" for row in rows for text in row.problems + row.notes
    ]
    return "\n".join([*lines, "", about])


def _n(value: int | None) -> str:
    return "" if value is None else f"{value:,}"


def _f(value: float | None, form: str) -> str:
    return "" if value is None else form.format(value)
