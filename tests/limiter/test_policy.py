"""The adaptive rate's and the refunds' arithmetic, called directly: each policy function of the
limiter's Lua library takes values and returns values, so Hypothesis can hand it any state and
compare the answer with the reference model (tests/limiter/model.py, written from
docs/limiter.md) or with the rule itself, without driving a bucket into that state first."""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass

import hypothesis.strategies as st
import pytest
import redis
from hypothesis import given, settings

from ratejobs.limiter.scripts import PRELUDE
from tests.limiter.model import ModelConfig, ReferenceLimiter

MICROS = 1_000_000
NOW = 1_767_225_600 * MICROS

# Calls one library function with JSON arguments; numbers come back as exact strings (cjson
# would round them to 14 digits), tables field by field.
CALL_FUNCTION = """
local function exact(v)
  if type(v) == 'number' then
    return as_string(v)
  elseif type(v) == 'table' then
    local out = {}
    for k, x in pairs(v) do
      out[k] = exact(x)
    end
    return out
  end
  return v
end
local args = cjson.decode(ARGV[2])
local fn = {
  current_rate = current_rate,
  learning_phase_due = learning_phase_due,
  learning_phase = learning_phase,
  after_throttle = after_throttle,
  signal_changes = signal_changes,
  shifted_window = shifted_window,
}
return cjson.encode(exact({fn[ARGV[1]](unpack(args))}))
"""


@pytest.fixture(scope="module")
def call_lua(redis_url: str):
    client = redis.Redis.from_url(redis_url)
    script = client.register_script(PRELUDE + "\n" + CALL_FUNCTION)

    def call(name: str, *args):
        return json.loads(script(keys=[], args=[name, json.dumps(args)]))

    return call


@dataclass(frozen=True)
class Case:
    """An adaptive bucket's config and learning state at NOW, as the model holds them."""

    config: ModelConfig
    model: ReferenceLimiter

    def __repr__(self) -> str:
        return f"Case({self.config!r}, {self.lua_state()!r}, grants={self.model.grants})"

    def lua_config(self) -> dict:
        c = self.config
        return {
            "adaptive": c.adaptive,
            "learn": c.learn,
            "rate": c.rate,
            "period": c.period,
            "min_rate": c.min_rate,
            "decrease_factor": c.decrease_factor,
            "recovery_seconds": c.recovery_seconds,
        }

    def lua_state(self, now: int = NOW) -> dict:
        """The state as load_state reads it at `now`: schedule times as offsets from it."""
        m = self.model
        state = {
            "learn_sure": m.learn_sure,
            "learn_grants": m.learn_grants,
            "learn_base_late": m.learn_base_late,
            "generation": m.generation,
            "blocked_until": m.blocked_until,
            "granted_tat": ReferenceLimiter.offset(m.granted_tat, now),
        }
        optional = {
            "learned": m.learned,
            "learn_target": m.learn_target,
            "learn_from": m.learn_from,
            "wmax": m.wmax,
            "wstart": m.wstart,
            "decreased_at": m.decreased_at,
            "learn_base_gen": m.learn_base_gen,
        }
        if m.learn_base is not None:
            optional["learn_base_us"], optional["learn_base_grants"] = m.learn_base
        # cjson has no nil: an absent field is left out, as HMGET's nil is in load_state
        state.update({k: v for k, v in optional.items() if v is not None})
        return state


@st.composite
def cases(draw) -> Case:
    rate = draw(st.sampled_from([5.0, 10.0, 25.0, 100.0, 1000.0]))
    config = ModelConfig(
        rate=rate,
        period=draw(st.sampled_from([1.0, 60.0])),
        burst=1,
        max_concurrency=0,
        adaptive=True,
        min_rate=rate * draw(st.sampled_from([0.01, 0.3])),
        decrease_factor=draw(st.sampled_from([0.5, 0.7, 0.9])),
        recovery_seconds=draw(st.sampled_from([2.0, 20.0])),
        learn=draw(st.booleans()),
    )
    m = ReferenceLimiter(config=config, generation=NOW - 10 * MICROS)
    m.grants = draw(st.integers(0, 5_000))
    # the last grant's schedule: sending now, or idle for up to two periods
    idle_us = draw(st.sampled_from([0, 0, 30_000, 3 * MICROS, 150 * MICROS]))
    m.granted_tat = (NOW - idle_us, 0.0)
    m.blocked_until = NOW - draw(st.sampled_from([MICROS, 0])) + draw(st.sampled_from([0, 1_500]))
    if draw(st.booleans()):
        m.wmax = rate * draw(st.floats(0.3, 1.0))
        m.wstart = m.wmax * config.decrease_factor
        m.decreased_at = NOW - draw(st.integers(0, 60 * MICROS))
    if draw(st.integers(0, 4)):
        m.learn_target = rate * draw(st.floats(0.05, 1.0))
        m.learn_from = NOW - draw(st.integers(0, 90 * MICROS))
        span_s = (NOW - m.learn_from) / MICROS
        allowed = m.learn_target * span_s * 2 / config.period
        m.learn_grants = max(0, m.grants - draw(st.integers(0, int(allowed) + 3)))
        if draw(st.booleans()):
            m.learned = rate * draw(st.floats(0.05, 1.0))
            m.learn_sure = draw(st.booleans())
        if draw(st.booleans()):
            base_us = draw(st.integers(1, 5 * MICROS))
            m.learn_base = (base_us, draw(st.integers(0, 40)))
            m.learn_base_gen = m.generation - draw(st.integers(0, 2))
            m.learn_base_late = draw(st.integers(0, 3))
    return Case(config, m)


def assert_close(lua_value, model_value) -> None:
    if isinstance(model_value, bool) or model_value is None:
        assert lua_value == model_value
    else:
        assert float(lua_value) == pytest.approx(model_value, rel=1e-9, abs=1e-6)


@settings(max_examples=300, deadline=None)
@given(case=cases(), later_us=st.sampled_from([0, 1, 400_000, 30 * MICROS]))
def test_current_rate_is_the_models(call_lua, case: Case, later_us: int) -> None:
    # A1-A4: the rate at any moment, from any learning or CUBIC state
    now = NOW + later_us
    [rate] = call_lua("current_rate", case.lua_config(), case.lua_state(now), now)
    assert float(rate) == pytest.approx(case.model.current_rate(now), rel=1e-9)
    assert case.config.min_rate * (1 - 1e-9) <= float(rate) <= case.config.rate * (1 + 1e-9)


@settings(max_examples=300, deadline=None)
@given(case=cases())
def test_a_learning_phase_starts_as_the_model_says(call_lua, case: Case) -> None:
    # A3, A4: at the first acquire of a state and the first after an idle spell
    cfg, state = case.lua_config(), case.lua_state()
    [due] = call_lua("learning_phase_due", cfg, state, NOW)
    model = case.model
    before = (model.learn_target, model.learn_from, model.learn_grants)
    model._start_learning_phase(NOW)
    assert due == ((model.learn_target, model.learn_from, model.learn_grants) != before)
    if due:
        [phase] = call_lua("learning_phase", cfg, state, NOW, model.grants)
        assert float(phase["learn_target"]) == pytest.approx(model.learn_target, rel=1e-9)
        assert float(phase["learn_from"]) == model.learn_from == NOW
        assert float(phase["learn_grants"]) == model.grants


@settings(max_examples=500, deadline=None)
@given(case=cases(), rate_before=st.floats(0.05, 1.0))
def test_a_throttle_teaches_what_the_model_learns(call_lua, case: Case, rate_before: float) -> None:
    # A3: the estimate, whether it is sure, the base interval and the next phase
    if not case.config.learn:
        return
    before = case.config.rate * rate_before
    cfg, state, grants = case.lua_config(), case.lua_state(), case.model.grants
    [changes] = call_lua("after_throttle", cfg, state, NOW, before, grants)
    model = case.model
    model._learn(NOW, before)
    assert_close(changes["learn_target"], model.learn_target)
    assert_close(changes["learn_from"], model.learn_from)
    assert_close(changes["learn_grants"], model.grants)
    assert changes["learn_sure"] == model.learn_sure
    assert_close(changes.get("learned", state.get("learned")), model.learned)
    if "learn_base_us" in changes:
        assert (float(changes["learn_base_us"]), float(changes["learn_base_grants"])) == (
            pytest.approx(model.learn_base[0]),
            pytest.approx(model.learn_base[1]),
        )
    # A1: a throttle never raises the rate
    assert float(changes["learn_target"]) <= before * (1 + 1e-12)


@settings(max_examples=300, deadline=None)
@given(
    case=cases(),
    generation=st.sampled_from(["current", "older", "none", "base"]),
    block_us=st.sampled_from([0, 0, 1_000, 2 * MICROS]),
    throttled=st.booleans(),
)
def test_a_signal_changes_what_the_model_says(
    call_lua, case: Case, generation: str, block_us: int, throttled: bool
) -> None:
    # B1, B2, A2: the block moves later only; an accepted throttle cuts CUBIC's rate once
    model = case.model
    gen = {
        "current": model.generation,
        "older": model.generation - 1,
        "none": -1,
        "base": model.learn_base_gen if model.learn_base_gen is not None else -1,
    }[generation]
    cfg, state = case.lua_config(), case.lua_state()
    accepted, rate_before, changes = call_lua(
        "signal_changes", cfg, state, NOW, gen, block_us, throttled
    )
    late_before = model.learn_base_late
    expected_accepted, _, blocked_until, before, _ = model.feedback(NOW, gen, block_us, throttled)
    assert accepted == expected_accepted
    assert float(rate_before) == pytest.approx(before, rel=1e-9)
    assert_close(changes.get("blocked_until", state["blocked_until"]), blocked_until)
    if accepted and case.config.adaptive:
        assert_close(changes["wmax"], model.wmax)
        assert_close(changes["wstart"], model.wstart)
        assert_close(changes["decreased_at"], NOW)
    if not accepted:
        late = float(changes.get("learn_base_late", state["learn_base_late"]))
        assert late == model.learn_base_late >= late_before


# give_back on a real history key: the windows' schedules after it, then the history.
GIVE_BACK = """
local cfg = {windows = cjson.decode(ARGV[1])}
local st = {w = cjson.decode(ARGV[2])}
give_back(KEYS[1], cfg, st, cjson.decode(ARGV[3]))
local w = {}
for i, x in ipairs(st.w) do
  w[i] = {as_string(x.tat), as_string(x.granted)}
end
return {cjson.encode(w), redis.call('ZRANGE', KEYS[1], 0, -1)}
"""


@pytest.fixture(scope="module")
def give_back(redis_url: str):
    client = redis.Redis.from_url(redis_url)
    yield client, client.register_script(PRELUDE + "\n" + GIVE_BACK)
    client.close()


def _give_back_one_at_a_time(windows, schedules, history, refunds):
    """The rule, refund by refund, newest reservation first: each gives back its units at each
    cost window's interval, capped by the least headroom of the reservations made since it
    (nothing when the history no longer holds its own entry), never into the past; what it gives
    back is used up from those headrooms."""
    schedules = [list(w) for w in schedules]
    history = [list(entry) for entry in history]  # [window, seq, headroom], by seq
    for seq, units, granted in sorted(refunds, key=lambda r: -r[0]):
        if seq < 0 or units <= 0 or not history or history[0][1] > seq:
            continue
        later = [entry for entry in history if entry[1] > seq]
        given = {}
        for i, window in enumerate(windows, start=1):
            least = min((h for j, _, h in later if j == i), default=math.inf)
            shift = min(units * window["interval"], least)
            tat, granted_tat = schedules[i - 1]
            schedules[i - 1][0] = max(tat - shift, min(tat, 0))
            if granted:
                schedules[i - 1][1] = max(granted_tat - shift, min(granted_tat, 0))
            given[i] = math.floor(shift)
        for entry in later:
            entry[2] = max(0, entry[2] - given[entry[0]])
    return schedules, history


@settings(max_examples=300, deadline=None)
@given(
    intervals=st.lists(st.floats(10.0, 1e6), min_size=1, max_size=3),
    headrooms=st.lists(
        st.tuples(st.integers(1, 3), st.integers(0, 10**7)), min_size=0, max_size=12
    ),
    # one refund per reservation, as a batch of settles has (two for one would be given back
    # in an order Lua's sort does not fix, and each order keeps the bound)
    refunds=st.lists(
        st.tuples(st.integers(-1, 14), st.integers(0, 300), st.booleans()),
        max_size=6,
        unique_by=lambda refund: refund[0],
    ),
    schedules=st.lists(
        st.tuples(st.floats(-1e7, 1e8), st.floats(-1e7, 1e8)),
        min_size=3,
        max_size=3,
    ),
    first_seq=st.integers(1, 3),
)
def test_refunds_in_one_pass_give_back_what_one_at_a_time_would(
    give_back, intervals, headrooms, refunds, schedules, first_seq
) -> None:
    # S2: each refund moves a cost window's schedule back by its units at the window's
    # interval, capped by the least headroom of the reservations made since; never into the
    # past. A batch (release_many's settles) is read and written in one pass over the history,
    # and must leave what the refunds one at a time, newest first, would.
    windows = [{"cost": True, "interval": interval} for interval in intervals]
    schedules = schedules[: len(windows)]
    history = [
        [min(i, len(windows)), seq, headroom]
        for seq, (i, headroom) in enumerate(headrooms, start=first_seq)
    ]
    client, script = give_back
    key = f"t-{uuid.uuid4().hex[:12]}:heads"
    for i, seq, headroom in history:
        client.zadd(key, {f"{i}:{seq}:{headroom}": seq})
    w_json, members = script(
        keys=[key],
        args=[
            json.dumps(windows),
            json.dumps([{"tat": tat, "granted": granted} for tat, granted in schedules]),
            json.dumps([{"seq": q, "units": u, "granted": g} for q, u, g in refunds]),
        ],
    )
    client.delete(key)
    expected_schedules, expected_history = _give_back_one_at_a_time(
        windows, schedules, history, refunds
    )
    for (tat, granted), (expected_tat, expected_granted) in zip(
        json.loads(w_json), expected_schedules, strict=True
    ):
        assert float(tat) == pytest.approx(expected_tat, abs=1e-6)
        assert float(granted) == pytest.approx(expected_granted, abs=1e-6)
    got = sorted(tuple(int(x) for x in m.decode().split(":")) for m in members)
    assert got == sorted(tuple(entry) for entry in expected_history)
