"""APIs (limits and credentials), jobs (batches of calls), calls and throttle events.

The database is the source of truth for every call; Redis holds only limiter state and the
broker's messages, so losing Redis loses nothing.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from ratejobs.limiter import LimiterConfig
from ratejobs.limiter.config import (
    MAX_BURST,
    MAX_CONCURRENCY,
    MAX_COST,
    MAX_PERIOD,
    MAX_RATE,
    Window,
)

# Priority weights a job's share of its API against the other running jobs (stride scheduling).
MAX_PRIORITY = 10
MIN_RATE = 1e-6
MIN_PERIOD = 1e-3
# 429s one call may take: each waits at least a Retry-After, so more is a call that never ends.
MAX_THROTTLED_RETRIES = 1000
MAX_ATTEMPTS = 100
MIN_TIMEOUT = 0.1
MAX_TIMEOUT = 600.0
# A credential's key: also part of its limiter's name (`{api}:{key}`), so never a ':'.
CREDENTIAL_KEY_PATTERN = r"^[A-Za-z0-9_.-]{1,100}\Z"
CREDENTIAL_KEY_MAX_LENGTH = 100
CREDENTIAL_KEY_MESSAGE = "a credential key is 1 to 100 of A-Z a-z 0-9 _ . -"


def api_windows(limits: object) -> tuple[Window, ...]:
    """An API's stored `limits` as the limiter's windows; ValueError when they are not (the
    services check them item by item first: services.apis.limits_errors)."""
    if not isinstance(limits, list):
        raise ValueError("limits must be a list of windows")
    try:
        return tuple(Window(**item) for item in limits)
    except TypeError as exc:  # not an object, or fields a window does not have
        raise ValueError(f"limits: {exc}") from None


class Api(models.Model):
    """A third-party API: where it lives, how fast it may be called, and how to authenticate."""

    name = models.SlugField(max_length=100, unique=True, help_text="also the limiter's name")
    base_url = models.URLField(max_length=2000)
    # The bounds are the limiter's (limiter.config); rate / period is bounded there too.
    rate = models.FloatField(
        validators=[MinValueValidator(MIN_RATE), MaxValueValidator(MAX_RATE)],
        help_text="requests per period",
    )
    period = models.FloatField(
        default=1.0, validators=[MinValueValidator(MIN_PERIOD), MaxValueValidator(MAX_PERIOD)]
    )
    burst = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(MAX_BURST)]
    )
    max_concurrency = models.PositiveIntegerField(
        default=0, validators=[MaxValueValidator(MAX_CONCURRENCY)], help_text="0: no in-flight cap"
    )
    adaptive = models.BooleanField(default=False)
    min_rate = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(MIN_RATE), MaxValueValidator(MAX_RATE)],
    )
    max_attempts = models.PositiveIntegerField(
        default=5, validators=[MinValueValidator(1), MaxValueValidator(MAX_ATTEMPTS)]
    )
    max_throttled_retries = models.PositiveIntegerField(
        default=50,
        validators=[MaxValueValidator(MAX_THROTTLED_RETRIES)],
        help_text="429s a call may receive before it fails; they do not use attempts",
    )
    timeout = models.FloatField(
        default=30.0,
        validators=[MinValueValidator(MIN_TIMEOUT), MaxValueValidator(MAX_TIMEOUT)],
        help_text="read timeout, seconds",
    )
    default_headers = models.JSONField(default=dict, blank=True)
    auth_header = models.CharField(max_length=100, default="Authorization")
    # Sent with the same value on every attempt of a call (retries, crashes, redispatches), so
    # an API that deduplicates by it (Stripe's Idempotency-Key) acts on each call once.
    idempotency_header = models.CharField(
        max_length=100,
        blank=True,
        help_text="header carrying a key that is the same on every attempt of a call "
        "(e.g. Idempotency-Key); empty: none sent",
    )
    # Windows besides rate/period/burst (an hourly and a daily quota, tokens per minute): a
    # list of {"rate", "period", "burst", "unit"} checked by limiter.config.Window in the
    # services; every grant must fit each of them (one script).
    limits = models.JSONField(
        default=list,
        blank=True,
        help_text='more windows every call must fit, e.g. [{"rate": 10000, "period": 86400, '
        '"burst": 1000}]; "unit": "cost" counts each call\'s cost (tokens) instead of requests',
    )
    # Where a response says what the call really cost (tokens used), to correct the estimate
    # charged to the cost windows: a header, or a dotted path into a JSON body.
    cost_header = models.CharField(
        max_length=100,
        blank=True,
        help_text="response header carrying the call's actual cost (e.g. X-Tokens-Used); "
        "empty: none",
    )
    cost_json_field = models.CharField(
        max_length=200,
        blank=True,
        help_text="dotted path to the actual cost in a JSON response (e.g. usage.total_tokens); "
        "empty: none",
    )
    # A secret is either named by an environment variable of the workers, or stored encrypted
    # (Fernet); it is never stored, returned or logged in clear.
    credential_env = models.CharField(max_length=200, blank=True)
    credential_encrypted = models.TextField(blank=True, editable=False)
    # Who may spend this API's quota and credential (ratejobs.permissions.can_submit_to).
    submitter_groups = models.ManyToManyField(
        "auth.Group",
        blank=True,
        related_name="submittable_apis",
        help_text="only members of these groups (and managers) may submit jobs to this API; "
        "none: everyone who may sign in",
    )
    # Bumped with every change of the limits; the limiter in Redis keeps the version it was
    # configured with, and workers rewrite a configuration older than theirs (a Redis restored
    # from an old snapshot, a change made while Redis was down): the database's limits win.
    limits_version = models.PositiveBigIntegerField(default=1, editable=False)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "API"
        verbose_name_plural = "APIs"
        # The manager role of ratejobs.permissions; grant it to a user or a group.
        permissions = [("manage_api", "Can create and change APIs, limits and credentials")]

    def __str__(self) -> str:
        return self.name

    @property
    def has_credential(self) -> bool:
        return bool(self.credential_env or self.credential_encrypted)

    def limiter_config(self) -> LimiterConfig:
        return LimiterConfig(
            rate=self.rate,
            period=self.period,
            burst=self.burst,
            max_concurrency=self.max_concurrency,
            adaptive=self.adaptive,
            min_rate=self.min_rate,
            version=self.limits_version,
            windows=api_windows(self.limits),
        )

    @property
    def max_cost(self) -> int | None:
        """The largest cost one call may have (None: cost is not limited); read from the
        stored windows without building them, as it is checked for every submitted call."""
        bursts = [
            w.get("burst")
            for w in self.limits
            if isinstance(w, dict) and w.get("unit") == "cost" and isinstance(w.get("burst"), int)
        ] if isinstance(self.limits, list) else []  # fmt: skip
        return min(bursts) if bursts else None


class CallbackStatus(models.TextChoices):
    """Where a finished job's callback stands; blank: no callback, or the job is not finished."""

    PENDING = "pending"  # waiting for its (next) attempt
    SENDING = "sending"  # a worker holds it and is sending it now
    DELIVERED = "delivered"  # the receiver answered 2xx
    # given up: attempts used up, past its deadline, a 4xx, an address the policy refuses, or
    # superseded (the job ran again before it went out)
    FAILED = "failed"


class Job(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        PAUSED = "paused"
        CANCELLED = "cancelled"
        COMPLETED = "completed"

    ACTIVE = (Status.QUEUED, Status.RUNNING)

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="jobs"
    )
    api = models.ForeignKey(Api, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    priority = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(MAX_PRIORITY)]
    )
    total = models.PositiveIntegerField(default=0)
    succeeded = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    cancelled = models.PositiveIntegerField(default=0)
    throttled = models.PositiveIntegerField(default=0, help_text="429 responses received")
    retries = models.PositiveIntegerField(default=0)
    # Stride scheduling among the running jobs of one API: each dispatched call advances the
    # job's pass by 1/priority, and the job with the lowest pass goes next.
    dispatch_pass = models.FloatField(default=0.0)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    # Whose quota the calls spend: an ApiCredential of the API by key (its own secret and its
    # own limiter bucket); blank: the API's own credential. A call may name its own.
    # db_default too (both here and on Call): rows written by SQL that names no key (an older
    # worker during a deploy, a bulk load) use the API's own credential.
    credential_key = models.CharField(
        max_length=CREDENTIAL_KEY_MAX_LENGTH,
        blank=True,
        default="",
        db_default="",
        validators=[RegexValidator(CREDENTIAL_KEY_PATTERN, CREDENTIAL_KEY_MESSAGE)],
    )
    # With the call's index, the key an API's idempotency_header carries: unique across jobs
    # and deployments, and the same on every attempt of a call.
    uuid = models.UUIDField(default=uuid.uuid4, editable=False)
    created = models.DateTimeField(auto_now_add=True)
    # When to run: nothing is dispatched before not_before, and calls not started by the
    # deadline are cancelled with that reason.
    not_before = models.DateTimeField(null=True, blank=True, help_text="no call is sent before")
    deadline = models.DateTimeField(
        null=True, blank=True, help_text="calls not started by then are cancelled"
    )
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    # Set when a purge begins (services.retention): the job leaves every list and page at once,
    # while its calls are deleted in batches behind it; a purge left half-done is finished by
    # beat or by running `purge_job` again.
    purge_started = models.DateTimeField(null=True, blank=True, editable=False)
    # Set once retention has cleared the response bodies of every call of the finished job, so
    # later runs skip it; a retry of its failed calls clears it.
    bodies_removed_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Where the job's summary is POSTed, signed with the owner's SigningKey, each time the job
    # finishes (services.callbacks); the outbound address policy applies as to an API's calls.
    callback_url = models.URLField(max_length=2000, blank=True)
    callback_status = models.CharField(
        max_length=16, choices=CallbackStatus.choices, blank=True, editable=False
    )
    # The id of the current delivery (X-Ratejobs-Delivery), new at each finish and the same on
    # every attempt of it, so a receiver can drop a repeat; a sender may record its attempt only
    # while the delivery it claimed is still the current one.
    callback_delivery = models.UUIDField(null=True, blank=True, editable=False)
    callback_attempts = models.PositiveIntegerField(default=0, editable=False)
    callback_last_error = models.TextField(blank=True, editable=False)
    callback_next_attempt_at = models.DateTimeField(null=True, blank=True, editable=False)
    # A sender holds the delivery until then; past it, the sender is presumed dead and the
    # reconciler gives the delivery back.
    callback_claimed_until = models.DateTimeField(null=True, blank=True, editable=False)
    callback_delivered_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The JSON body every attempt of the current delivery sends, built in the transaction that
    # finished the job: the state that finish announced, not the job's when it is sent.
    callback_body = models.TextField(blank=True, editable=False)
    # Seconds of the run (after `started`) spent in pauses that have ended (JobPause), added
    # when each ends: duration and average rate leave them out without reading the pauses of
    # every job a list shows. db_default: rows written by SQL that names none have not paused.
    paused_seconds = models.FloatField(default=0.0, db_default=0.0, editable=False)

    class Meta:
        ordering = ["-created"]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="job_unique_idempotency_key_per_owner",
            )
        ]
        indexes = [models.Index(fields=["api", "status"], name="job_api_status")]

    def __str__(self) -> str:
        return f"{self.name} (#{self.pk})"

    @property
    def done(self) -> int:
        return self.succeeded + self.failed + self.cancelled

    @property
    def progress(self) -> float:
        return 1.0 if not self.total else self.done / self.total


class Call(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    FINAL = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="calls")
    index = models.PositiveIntegerField()
    method = models.CharField(max_length=10)
    path = models.CharField(max_length=2000)
    query = models.JSONField(null=True, blank=True)
    headers = models.JSONField(null=True, blank=True)
    json = models.JSONField(null=True, blank=True)
    body = models.TextField(null=True, blank=True)
    # This call's own ApiCredential key; blank: the job's (Job.credential_key).
    credential_key = models.CharField(
        max_length=CREDENTIAL_KEY_MAX_LENGTH, blank=True, default="", db_default=""
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0, help_text="requests sent")
    throttled_count = models.PositiveIntegerField(default=0, help_text="429s received")
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # Set when a broker message for this call was sent, cleared when the call goes back to
    # waiting: the dispatcher keeps the number of calls in the broker bounded with it.
    dispatched_at = models.DateTimeField(null=True, blank=True)
    # A running call belongs to the process holding this token until running_until, or until
    # that process stops sending heartbeats (WorkerProcess); then it may be taken over. A call
    # in the broker's window names the worker process that dispatched it (claim_owner; blank
    # when beat's reconciler did), given back if that process dies (it may have died before
    # sending the message).
    claim_token = models.CharField(max_length=32, blank=True)
    claim_owner = models.CharField(
        max_length=300, blank=True, help_text="the claiming process (WorkerProcess.owner)"
    )
    running_until = models.DateTimeField(null=True, blank=True)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    response_headers = models.JSONField(null=True, blank=True)
    response_body = models.BinaryField(null=True, blank=True)
    response_truncated = models.BooleanField(default=False)
    # When retention cleared the stored response body and headers (RATEJOBS_KEEP_BODIES_DAYS),
    # so that pages say they were removed rather than show a call that got nothing back.
    response_removed_at = models.DateTimeField(null=True, blank=True, editable=False)
    error = models.TextField(blank=True)
    duration = models.FloatField(null=True, blank=True, help_text="seconds of the last request")
    # What the call is expected to cost in the API's "cost" windows (tokens), charged when its
    # slot is granted; 0 takes nothing from them. cost_used is what the last response said it
    # cost (cost_header / cost_json_field), the difference charged or refunded then.
    # db_default too: rows written by SQL that names no cost (an older worker during a
    # deploy, a bulk load) cost nothing, rather than failing the insert.
    cost = models.PositiveIntegerField(
        default=0,
        db_default=0,
        validators=[MaxValueValidator(MAX_COST)],
        help_text="estimated cost (tokens)",
    )
    cost_used = models.PositiveIntegerField(
        null=True, blank=True, help_text="cost the last response reported; null: none reported"
    )
    # A limiter slot beyond the worker's wait kept for this call (its place in line, so that
    # smaller calls cannot take the units it waits for): the limiter's name, the lease id, the
    # slot and what confirming it needs. The next attempt confirms it; null: none. Lost with
    # Redis, it only means the call asks again.
    reservation = models.JSONField(null=True, blank=True, editable=False)
    created = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "index"]
        constraints = [
            models.UniqueConstraint(fields=["job", "index"], name="call_unique_index_per_job")
        ]
        indexes = [
            models.Index(fields=["job", "status"], name="call_job_status"),
            # what the dispatcher looks for: waiting calls not yet in the broker
            models.Index(
                fields=["job", "index"],
                condition=Q(status="pending", dispatched_at__isnull=True),
                name="call_undispatched",
            ),
            # a job's pace and timeline: calls finished in a time range
            models.Index(
                fields=["job", "finished"],
                condition=Q(finished__isnull=False),
                name="call_job_finished",
            ),
            # what the sweep for dead workers looks at: running calls by their claiming process
            models.Index(
                fields=["claim_owner"],
                condition=Q(status="running"),
                name="call_running_owner",
            ),
            # the dispatch window: calls in the broker, counted at every dispatch (without
            # it, counting them read every pending call of a million-call job, 140 ms a run)
            models.Index(
                fields=["job"],
                condition=Q(status="pending", dispatched_at__isnull=False),
                name="call_in_window",
            ),
            # calls back from the database to confirm a kept place, dispatched before the others
            models.Index(
                fields=["job", "next_attempt_at"],
                condition=Q(
                    status="pending", dispatched_at__isnull=True, reservation__isnull=False
                ),
                name="call_kept_place",
            ),
            # what the reconciler looks for: calls in the broker or running
            models.Index(
                fields=["dispatched_at"],
                condition=Q(dispatched_at__isnull=False),
                name="call_dispatched",
            ),
        ]

    def __str__(self) -> str:
        # Named as the job page numbers it: the job and the call's index in it, never its id.
        return f"{self.job.name} #{self.index} ({self.method} {self.path})"


class CallAttempt(models.Model):
    """One request of a call as it went (or could not go) out: what each try got back, so that
    a call's page can say why it took five. Response headers are kept only where the limiter
    reads them (Retry-After and rate-limit fields, services.calls.throttle_headers); request
    headers, credentials and bodies never are. Written with the call's outcome, in the same
    transaction (services.calls.calls_record_outcomes)."""

    # Denormalised from the call: retention and purge remove a job's attempts by it, with no
    # join through the calls table.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="call_attempts")
    # indexed by attempt_call_finished, which leads with it: one index less to write per row
    call = models.ForeignKey(
        Call, on_delete=models.CASCADE, related_name="attempt_records", db_index=False
    )
    number = models.PositiveIntegerField(
        help_text="1 for the first request, throttled ones counted; a retry of failed calls "
        "starts again at 1, as the call's attempts do"
    )
    outcome = models.CharField(
        max_length=16, help_text="what the attempt led to: succeeded, failed, retry, throttled..."
    )
    started = models.DateTimeField(help_text="when the request went out (database clock)")
    finished = models.DateTimeField()
    duration = models.FloatField(null=True, blank=True, help_text="seconds of the request")
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    throttled = models.BooleanField(default=False)
    retry_after = models.CharField(
        max_length=100, blank=True, help_text="the response's Retry-After header, as sent"
    )
    retry_in = models.FloatField(
        null=True, blank=True, help_text="seconds the call was told to wait before its next try"
    )
    throttle_headers = models.JSONField(
        default=dict, blank=True, help_text="the rate-limit headers of the response"
    )

    class Meta:
        ordering = ["call", "finished", "pk"]
        indexes = [
            # a call's page lists its attempts in order
            models.Index(fields=["call", "finished"], name="attempt_call_finished"),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of call {self.call_id}"


class ApiCredential(models.Model):
    """One customer's credential for an API, named by a key: calls naming the key send its
    secret and are paced by a limiter bucket of their own (`{api}:{key}`) with the API's
    limits, created on first use. The secret is stored encrypted (Fernet) and never shown."""

    api = models.ForeignKey(Api, on_delete=models.CASCADE, related_name="credentials")
    key = models.CharField(
        max_length=CREDENTIAL_KEY_MAX_LENGTH,
        validators=[RegexValidator(CREDENTIAL_KEY_PATTERN, CREDENTIAL_KEY_MESSAGE)],
    )
    credential_encrypted = models.TextField(editable=False)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["api", "key"]
        constraints = [
            models.UniqueConstraint(fields=["api", "key"], name="api_credential_unique_key")
        ]

    def __str__(self) -> str:
        return f"{self.api_id}:{self.key}"


class JobSecond(models.Model):
    """How many of a job's calls ended (succeeded or failed) in one second, written with the
    outcomes: the job's pace and chart read these, never its calls (counting the finished
    calls of a million-call job took over a second per page)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="seconds")
    at = models.DateTimeField(help_text="the second (database clock), microseconds cut")
    calls = models.PositiveIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "at"], name="job_second_unique")]

    def __str__(self) -> str:
        return f"job {self.job_id} at {self.at}: {self.calls}"


class JobPause(models.Model):
    """A span when the job was paused, on the database's clock, written with the status change
    that began it; `ended` is set by the resume, cancel or completion that left the pause, null
    while the job is still paused. The job page's chart marks these."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="pauses")
    started = models.DateTimeField()
    ended = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # A job is paused once at a time: a second pause racing the first opens nothing.
            models.UniqueConstraint(
                fields=["job"], condition=Q(ended__isnull=True), name="job_pause_one_open"
            )
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} paused {self.started} → {self.ended or 'now'}"


class ThrottleEvent(models.Model):
    class Kind(models.TextChoices):
        # Each is written (services.calls for a response's, services.apis for a manual block):
        # the admin offers them as a filter, and a kind nobody writes would filter to nothing.
        THROTTLED = "throttled", "429 received"
        BLOCKED = "blocked", "limiter blocked"
        RATE_DECREASED = "rate_decreased", "rate decreased"
        QUOTA_EXHAUSTED = "quota_exhausted", "quota exhausted (headers)"

    api = models.ForeignKey(Api, on_delete=models.CASCADE, related_name="throttle_events")
    job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.CASCADE, related_name="throttle_events"
    )
    call = models.ForeignKey(
        Call, null=True, blank=True, on_delete=models.SET_NULL, related_name="throttle_events"
    )
    kind = models.CharField(max_length=20, choices=Kind.choices)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    retry_after = models.FloatField(null=True, blank=True, help_text="seconds")
    rate_before = models.FloatField(null=True, blank=True)
    rate_after = models.FloatField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created"]
        indexes = [
            models.Index(fields=["api", "created"], name="throttle_api_created"),
            models.Index(fields=["job", "created"], name="throttle_job_created"),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} on {self.api.name} at {self.created:%Y-%m-%d %H:%M:%S}"


class WorkerProcess(models.Model):
    """A process that claims calls, and when it last said it was alive. A call whose claim
    belongs to a process not seen for RATEJOBS_WORKER_DEAD_AFTER seconds is taken back: a
    host name and pid cannot tell (containers on one host network share a host name)."""

    owner = models.CharField(max_length=100, unique=True, help_text="host:pid:random")
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    started = models.DateTimeField()
    seen_at = models.DateTimeField(db_index=True, help_text="last heartbeat (database clock)")

    def __str__(self) -> str:
        return self.owner


class SigningKey(models.Model):
    """A user's secret for signing job callbacks (HMAC-SHA256), stored encrypted with the API
    credentials' Fernet key; shown once, when it is made or rotated."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="signing_key"
    )
    secret_encrypted = models.TextField(editable=False)
    created = models.DateTimeField(help_text="when the current secret was made")
    rotated = models.DateTimeField(
        null=True, blank=True, help_text="when the secret was last replaced; null: never"
    )

    def __str__(self) -> str:
        return f"signing key of {self.user}"


class KeptUpload(models.Model):
    """The file of calls a user's last refused submit on the admin page kept, so the next try
    can use it again (a browser empties its file input): one per user, a new one replacing it,
    in the database rather than in the Redis the limiter and the broker live in."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="kept_upload"
    )
    token = models.CharField(max_length=64, editable=False)
    name = models.CharField(max_length=255, editable=False)
    content = models.BinaryField(editable=False)
    size = models.PositiveIntegerField(editable=False)
    kept_until = models.DateTimeField(db_index=True, editable=False)

    def __str__(self) -> str:
        return f"{self.name} kept for {self.user}"
