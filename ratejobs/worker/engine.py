"""A worker process's engine: up to RATEJOBS_CALLS_IN_FLIGHT calls in flight at once on a pool
of threads, their outcomes written in bulk by one recorder thread.

A Celery task hands its message's calls to the engine and returns once they are claimed and
running, so a prefork process takes its next message while earlier calls wait on slow APIs.
Database connections per process: the task's thread (claims, dispatch) and the recorder's
(outcomes, heartbeat, the sweep for dead workers), whatever the pool's size. The call threads
touch Redis and the network only.

A message is acknowledged when its calls are running, not finished: what keeps a call from
being lost when its process dies is its claim in the database, which the sweep takes back when
the process stops sending heartbeats (worker/reconcile.calls_recover_orphans).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace

import redis
from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection

from ratejobs.infra.clock import database_now
from ratejobs.infra.connections import redis_client
from ratejobs.infra.heartbeats import (
    process_owner,
    worker_forget,
    worker_heartbeat,
    workers_alive,
)
from ratejobs.infra.wakeups import request_dispatch
from ratejobs.models import ApiCredential, Job
from ratejobs.namespace import redis_key
from ratejobs.services.calls import (
    Claimed,
    Finished,
    LeaseReturn,
    call_attempt,
    calls_claim,
    calls_record_outcomes,
    calls_reserve_slots,
    calls_slot_too_far,
)
from ratejobs.worker.places import PlaceQueue
from ratejobs.worker.pool import CallPool
from ratejobs.worker.reconcile import calls_recover_orphans, calls_release_claim
from ratejobs.worker.returns import LeaseReturns

logger = logging.getLogger(__name__)

# Outcomes written per transaction at most: large enough that a busy process writes a few
# times a second, small enough that one transaction holds its job locks for milliseconds.
RECORD_BATCH = 500
# Outcomes are written together when they end within this long of the first: a process
# sending 40 calls/s (an API's 300/s over 8 processes) wrote them one or two per transaction,
# and its recorder's statements took a fifth of its CPU (bench-fleet, 2 x -c 4).
RECORD_GATHER_SECONDS = 0.25
# After a failed write (database restarting) the recorder tries again this much later; the
# claims it holds stay valid for minutes meanwhile.
RECORD_RETRY_SECONDS = 1.0
_STOP = object()
# A message's calls are claimed in batches of at least this many when the pool is full,
# waiting up to CLAIM_GATHER_SECONDS for the places: a fast API frees them within
# milliseconds, and one claim per freed place cost a fifth of the CPU per call in bench-jobs.
CLAIM_GATHER = 16
CLAIM_GATHER_SECONDS = 0.02
GIL_SWITCH_SECONDS = 0.0005
# A process holds at most its share of an API's calls: the API's rate divided among
# the live worker processes, over SHARE_HORIZON_SECONDS plus the API's recent response time,
# and never fewer than SHARE_MIN calls. More only wait, asleep on reserved slots further and
# further ahead (2 workers of -c 4 at 300/s held 300 such sleepers, and the processes' cores
# could not wake them all on time: a tenth of the slots went stale), or are sent back.
SHARE_HORIZON_SECONDS = 0.25
SHARE_MIN = 16
FLEET_CHECK_SECONDS = 5.0
LATENCY_WEIGHT = 0.1  # of each new response time in the moving average
# An API's response time until its first response is in: a share sized for a fast API would
# hold a slow one's first second to a fraction of its rate (bench-slow, 1 s responses).
LATENCY_UNKNOWN_SECONDS = 1.0


@dataclass(frozen=True)
class _LostClaim:
    """A claim that failed part way: what the recorder gives back (calls_release_claim)."""

    token: str
    call_ids: list[int]


class Engine:
    def __init__(self, *, in_flight: int, heartbeat_seconds: float, sweep_seconds: float) -> None:
        self.owner = process_owner()
        # A thread that slept until its limiter slot must confirm it within one slot (10 ms at
        # 100/s) or the slot is lost; behind Python's default 5 ms GIL hand-off, among dozens
        # of threads, it too often is (bench-slow measures the pace this keeps).
        sys.setswitchinterval(GIL_SWITCH_SECONDS)
        self.pool = CallPool(in_flight)
        # calls of each API with a share held (claimed, not finished), and its response time
        self._held = threading.Condition()
        self._held_by_api: dict[int, int] = {}
        self._latency_by_api: dict[int, float] = {}
        self._fleet, self._fleet_checked = 1, -FLEET_CHECK_SECONDS
        self._returns = LeaseReturns()
        self._places = PlaceQueue(self._run, max_wait=settings.RATEJOBS_MAX_WORKER_WAIT)
        self._heartbeat_seconds = heartbeat_seconds
        self._sweep_seconds = sweep_seconds
        self._finished: queue.SimpleQueue = queue.SimpleQueue()
        # The process claims nothing before its first heartbeat: a claim without one would
        # look like a dead process's to every other. The recorder writes it, on its own
        # connection: the engine may start inside Celery's worker_process_init, where
        # Celery's Django fixup closes the file descriptors of the calling thread's database
        # connections, and a connection opened there would later read another's socket.
        self._alive = threading.Event()
        self._recorder = threading.Thread(
            target=self._record_forever, name="ratejobs-recorder", daemon=True
        )
        self._recorder.start()

    def start(self, *, job_id: int, call_ids: Iterable[int]) -> list[Claimed]:
        """Claim the calls still wanted and start them, waiting for room in the pool as
        needed; returns the calls started. Room comes before the claim, so a claimed call
        never waits behind others here (its limiter wait bounds pause and cancel)."""
        self._alive.wait()
        remaining = list(call_ids)
        started: list[Claimed] = []
        share = self._share(job_id)
        while remaining:
            places = self.pool.reserve(
                len(remaining), gather=CLAIM_GATHER, gather_seconds=CLAIM_GATHER_SECONDS
            )
            if share is not None:
                places = self._within_share(share, places)
            batch, remaining = remaining[:places], remaining[places:]
            handed = 0
            try:
                token = uuid.uuid4().hex
                try:
                    claimed = calls_claim(
                        job_id=job_id, call_ids=batch, owner=self.owner, token=token
                    )
                except BaseException:
                    # It may have taken its calls before it failed: the recorder gives back
                    # whatever this claim holds once the database answers again.
                    self._finished.put(_LostClaim(token, batch))
                    raise
                claimed = calls_reserve_slots(claimed)
                for item in claimed:
                    if item.slot_in is not None:
                        # Its slot is beyond the wait: back to the database at once, as its
                        # attempt would have sent it, without holding a thread to find out.
                        # A fleet with more threads than an API's rate fills kept thousands
                        # of such attempts going, each a round trip on a busy CPU.
                        self._finished.put(Finished(item, calls_slot_too_far(item)))
                        continue
                    if share is not None:
                        item = replace(item, in_share=True)
                    if item.reserved is None and item.call.job.api.max_concurrency:
                        self._places.add(item)  # started once a place is free
                    else:
                        self._run(item)
                    handed += 1
                started += claimed
            finally:
                # Also when the task is cut short (Celery terminates a task it cannot
                # acknowledge after losing the broker): a place left reserved would hold a
                # stopping process for ENGINE_STOP_SECONDS, waiting for a call that never runs.
                self.pool.unreserve(places - handed)
                if share is not None:
                    self._release_share(share[0], places - handed)
        return started

    def stop(self, timeout: float) -> bool:
        """Let the calls in flight finish and their outcomes be written (a warm shutdown);
        False if that took longer than `timeout`: their claims are then taken back later."""
        deadline = time.monotonic() + timeout
        idle = self.pool.wait_idle(timeout)
        self._returns.stop(max(0.0, deadline - time.monotonic()))
        self._finished.put(_STOP)
        self._recorder.join(max(0.0, deadline - time.monotonic()))
        if idle and not self._recorder.is_alive():
            # on a database error its row ages out: it holds no claims
            with contextlib.suppress(DatabaseError):
                worker_forget(owner=self.owner)
            return True
        return False

    def _share(self, job_id: int) -> tuple[int, int] | None:
        """(API id, the most calls of it this process holds) for a job of an API without
        credential keys, not adaptive; None for the others (each key's bucket adds the API's
        rate; an adaptive API's rate moves under the share, and its probes must find every
        slot filled: with a share, the end-to-end learning test learned 19.0-19.3/s of a real
        20/s in 2 runs of 5 on a loaded machine, 19.7-20.1 without). An API with an in-flight
        cap has one: its calls wait for places the same way, and claimed a few at a time they
        cost its 2 x -c 4 fleet a tenth of its pace in CPU."""
        job = Job.objects.select_related("api").filter(pk=job_id).first()
        if job is None or job.credential_key or job.api.adaptive:
            return None
        api = job.api
        if ApiCredential.objects.filter(api_id=api.pk).exists():
            return None
        now = time.monotonic()
        if now - self._fleet_checked >= FLEET_CHECK_SECONDS:
            self._fleet = max(1, workers_alive(database_now()))
            self._fleet_checked = now
        latency = self._latency_by_api.get(api.pk, LATENCY_UNKNOWN_SECONDS)
        per_process = api.rate / api.period / self._fleet
        return api.pk, max(SHARE_MIN, math.ceil(per_process * (SHARE_HORIZON_SECONDS + latency)))

    def _within_share(self, share: tuple[int, int], places: int) -> int:
        """Of `places` reserved in the pool, keep those within the API's share, waiting for
        its calls to finish when there is no room; the rest go back to the pool."""
        api_id, most = share
        with self._held:
            while self._held_by_api.get(api_id, 0) >= most:
                self._held.wait(0.5)
            # Claimed when the whole share is free, or after the horizon: the other processes'
            # calls fill the slots meanwhile. Claims of the calls that had just finished
            # (a few each, at 40 calls/s per process) took a third of the workers' CPU in
            # bench-fleet's 2 x -c 4 row, on a machine their CPU already bounded.
            enough = min(places, most)
            gathered_by = time.monotonic() + SHARE_HORIZON_SECONDS
            while most - self._held_by_api.get(api_id, 0) < enough:
                left = gathered_by - time.monotonic()
                if left <= 0:
                    break
                self._held.wait(left)
            room = min(places, most - self._held_by_api.get(api_id, 0))
            self._held_by_api[api_id] = self._held_by_api.get(api_id, 0) + room
        self.pool.unreserve(places - room)
        return room

    def _release_share(self, api_id: int, calls: int) -> None:
        if calls > 0:
            with self._held:
                self._held_by_api[api_id] -= calls
                self._held.notify_all()

    def _run(self, item: Claimed) -> None:
        self.pool.run(lambda: self._attempt(item))

    def _attempt(self, item: Claimed) -> None:
        try:
            self._attempt_and_hand_over(item)
        finally:
            if item.in_share:
                self._release_share(item.call.job.api_id, 1)

    def _attempt_and_hand_over(self, item: Claimed) -> None:
        outcome = call_attempt(item)
        if outcome.result is not None:
            api_id = item.call.job.api_id
            before = self._latency_by_api.get(api_id, outcome.result.duration)
            self._latency_by_api[api_id] = before + LATENCY_WEIGHT * (
                outcome.result.duration - before
            )
        if outcome.lease is not None and outcome.lease.leased:
            # a place under an in-flight cap: back now, not once the outcome is written
            self._returns.put(LeaseReturn(item.context.limiter, outcome.lease, outcome.cost_used))
            outcome = replace(outcome, lease=None)
        self._finished.put(Finished(item, outcome))

    def _record_forever(self) -> None:
        batch: list[Finished] = []
        lost: list[_LostClaim] = []
        next_beat = next_sweep = time.monotonic()
        stopping = False
        while not (stopping and not batch and not lost):
            if not stopping:
                stopping = self._collect(
                    batch, lost, timeout=max(0.0, next_beat - time.monotonic())
                )
            try:
                if batch:
                    calls_record_outcomes(batch)
                    batch = []
                while lost:
                    calls_release_claim(token=lost[0].token, call_ids=lost[0].call_ids)
                    lost.pop(0)
                now = time.monotonic()
                if now >= next_beat and not stopping:
                    worker_heartbeat(owner=self.owner)
                    next_beat = now + self._heartbeat_seconds
                    self._alive.set()
                if now >= next_sweep and not stopping:
                    next_sweep = now + self._sweep_seconds
                    self._sweep()
            except DatabaseError:
                logger.exception(
                    "could not write %d outcomes or the heartbeat; trying again", len(batch)
                )
                connection.close()
                time.sleep(RECORD_RETRY_SECONDS)
            except Exception:
                logger.exception("recorder: unexpected error; %d outcomes kept", len(batch))
                time.sleep(RECORD_RETRY_SECONDS)
            close_old_connections()
        connection.close()

    def _collect(self, batch: list[Finished], lost: list[_LostClaim], *, timeout: float) -> bool:
        """Wait up to `timeout` for an outcome, then take whatever else is ready; True once the
        stop marker came."""
        try:
            item = self._finished.get(timeout=timeout)
        except queue.Empty:
            return False
        gathered = False
        while True:
            if item is _STOP:
                return True
            if isinstance(item, _LostClaim):
                lost.append(item)
            else:
                batch.append(item)
            if len(batch) >= RECORD_BATCH:
                return False
            try:
                item = self._finished.get_nowait()
            except queue.Empty:
                if gathered:
                    return False
                # A sleep, not a timed get: under libfaketime (a worker whose clock is off, in
                # the clock tests) a timed wait on a lock ends by the real clock against a
                # deadline on the faked one, 30 s late, and the outcomes waited for it.
                time.sleep(RECORD_GATHER_SECONDS)
                gathered = True
                try:
                    item = self._finished.get_nowait()
                except queue.Empty:
                    return False

    def _sweep(self) -> None:
        """Take back calls of dead processes; one process of the deployment does it per
        interval (a Redis lock), so workers need no beat to lose nothing."""
        try:
            if not redis_client().set(
                redis_key("sweep", "lock"), self.owner, nx=True, px=int(self._sweep_seconds * 1000)
            ):
                return
        except (redis.RedisError, OSError):
            return  # the reconciler run by beat does it too
        recovered = calls_recover_orphans()
        if recovered:
            logger.info("took back %d calls of worker processes that died", recovered)


_engine: Engine | None = None
_engine_pid: int | None = None
_engine_lock = threading.Lock()


def engine() -> Engine:
    """This process's engine, made on first use (a forked child makes its own)."""
    global _engine, _engine_pid
    with _engine_lock:
        if _engine is None or _engine_pid != os.getpid():
            _engine = Engine(
                in_flight=settings.RATEJOBS_CALLS_IN_FLIGHT,
                heartbeat_seconds=settings.RATEJOBS_WORKER_HEARTBEAT_SECONDS,
                sweep_seconds=settings.RATEJOBS_WORKER_HEARTBEAT_SECONDS * 2,
            )
            _engine_pid = os.getpid()
        return _engine


def heartbeating_owner() -> str:
    """This process's owner name once its engine has written a heartbeat, else "": what a
    worker process marks the calls it dispatches with, so that they are given back if it dies
    before their messages are sent (a process whose heartbeat is not in yet would look dead)."""
    if _engine is None or _engine_pid != os.getpid() or not _engine._alive.is_set():
        return ""
    return _engine.owner


def engine_stop(timeout: float) -> bool:
    """Stop this process's engine, if it has one (a worker process shutting down)."""
    if _engine is None or _engine_pid != os.getpid():
        return True
    return _engine.stop(timeout)


def calls_start(*, job_id: int, call_ids: list[int]) -> int:
    """Start the message's calls on this process's engine; returns how many were started."""
    started = engine().start(job_id=job_id, call_ids=call_ids)
    if started:  # they left the broker's window, which may take more now
        request_dispatch(started[0].call.job.api_id)
    return len(started)
