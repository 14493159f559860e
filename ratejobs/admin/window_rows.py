"""An API's extra limit windows edited as rows of the admin's form, stored as the same JSON."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from decimal import Decimal, InvalidOperation
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.utils.html import format_html_join
from django.utils.safestring import mark_safe

from ratejobs.limiter.config import MAX_BURST, MAX_WINDOWS, is_positive_number
from ratejobs.services.apis import limits_errors

# A period is typed in the largest of these that divides it exactly (3600 s: 1 hour).
PERIOD_UNITS: dict[str, int] = {"seconds": 1, "minutes": 60, "hours": 3600, "days": 86_400}
COUNT_UNITS: dict[str, str] = {"requests": "requests", "cost": "cost units (tokens)"}
# Empty rows under the windows: no JavaScript adds rows, so a page offers this many more (up to
# MAX_WINDOWS rows in all); for more, save and edit again.
SPARE_ROWS = 2
NUMBER_FIELDS = ("rate", "period", "burst")


@dataclass(frozen=True)
class Row:
    """One row of the form as typed: strings, the period in `period_unit`."""

    rate: str = ""
    period: str = ""
    period_unit: str = "seconds"
    burst: str = ""
    unit: str = "requests"

    @property
    def is_empty(self) -> bool:
        return not any(getattr(self, name).strip() for name in NUMBER_FIELDS)


def number_text(value: float | Decimal) -> str:
    """A number as typed into a box: 3600.0 as "3600", 0.5 as "0.5" (never 1e+03)."""
    if not math.isfinite(value):
        return str(value)
    if value == int(value):
        return str(int(value))
    return format(Decimal(repr(value)) if isinstance(value, float) else value, "f")


def period_in_unit(seconds: float) -> tuple[Decimal, str]:
    """`seconds` in the largest unit that divides it exactly: 3600 -> (1, "hours"), 90 ->
    (90, "seconds")."""
    exact = Decimal(repr(float(seconds)))
    for unit, factor in reversed(PERIOD_UNITS.items()):
        if exact % factor == 0:
            return exact / factor, unit
    return exact, "seconds"


def row_from_window(window: Any) -> Row:
    if not isinstance(window, Mapping):  # nothing a stored API holds (the services check it)
        return Row()
    period, period_unit = _number_or_text(window.get("period")), "seconds"
    if is_positive_number(window.get("period")):
        amount, period_unit = period_in_unit(window["period"])
        period = number_text(amount)
    return Row(
        rate=_number_or_text(window.get("rate")),
        period=period,
        period_unit=period_unit,
        burst=_number_or_text(window.get("burst")),
        unit=str(window.get("unit", "requests")),
    )


def _number_or_text(value: Any) -> str:
    if value is None:
        return ""
    return number_text(value) if isinstance(value, int | float) else str(value)


def window_rule_text(window: Mapping) -> str:
    """A stored window in words: "1,000 requests per 1 hour, burst 100"."""
    rate, period, burst = (window.get(name) for name in NUMBER_FIELDS)
    if not all(is_positive_number(v) for v in (rate, period, burst)):
        return str(dict(window))
    amount, unit = period_in_unit(period)
    unit = unit.removesuffix("s") if amount == 1 else unit
    counts = "cost units" if window.get("unit") == "cost" else "requests"
    return f"{_grouped(rate)} {counts} per {number_text(amount)} {unit}, burst {_grouped(burst)}"


def _grouped(value: float) -> str:
    whole, _, fraction = number_text(value).partition(".")
    return f"{int(whole):,}" + (f".{fraction}" if fraction else "")


def windows_html(limits: Any) -> str:
    """An API's windows one a line, for those who see the page read-only; "none" without any."""
    if not isinstance(limits, list) or not limits:
        return "none"
    return format_html_join(
        mark_safe("<br>"),
        "{}",
        ((window_rule_text(w) if isinstance(w, Mapping) else str(w),) for w in limits),
    )


class WindowRowsWidget(forms.Widget):
    """A table of rows named `<name>-<i>-<field>`: rate, period and its unit, burst, unit."""

    template_name = "admin/ratejobs/api/window_rows.html"

    def get_context(self, name: str, value: Any, attrs: dict | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        rows = list(value or [])
        filled = sum(not row.is_empty for row in rows)
        rows += [Row()] * (max(len(rows), min(MAX_WINDOWS, filled + SPARE_ROWS)) - len(rows))
        id_ = context["widget"]["attrs"].get("id") or name
        context["widget"].update(
            rows=[
                {"number": i + 1, "name": f"{name}-{i}-", "id": f"{id_}-{i}-", "row": row}
                for i, row in enumerate(rows)
            ],
            period_units=list(PERIOD_UNITS),
            count_units=COUNT_UNITS.items(),
        )
        return context

    def format_value(self, value: Any) -> Any:
        return value  # the rows themselves; the template shows their strings

    def value_from_datadict(self, data: Any, files: Any, name: str) -> list[Row]:
        """Every posted row, empty ones included, in the page's order (errors name rows by
        their place on the page)."""
        rows = []
        while any(f"{name}-{len(rows)}-{field.name}" in data for field in fields(Row)):
            prefix = f"{name}-{len(rows)}-"
            given = {
                field.name: data[prefix + field.name]
                for field in fields(Row)
                if prefix + field.name in data
            }
            rows.append(Row(**given))
        return rows

    def value_omitted_from_data(self, data: Any, files: Any, name: str) -> bool:
        # A form without any row leaves the stored windows alone, as Django does for a field
        # with a default; its inputs are named after rows, never `name` alone.
        return not any(key.startswith(f"{name}-") for key in data)

    def id_for_label(self, id_: str) -> str:
        return f"{id_}-0-rate" if id_ else id_


ERROR_AT = re.compile(r"limits\[(\d+)\](?:\.(\w+))?(: )?")


class WindowRowsField(forms.Field):
    """Rows in, the stored JSON out: a list of {"rate", "period" (seconds), "burst", "unit"},
    checked by services.apis.limits_errors with its messages naming rows ("row 2: ...")."""

    widget = WindowRowsWidget

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> list[Row]:
        if not isinstance(value, list):
            return []
        return [row if isinstance(row, Row) else row_from_window(row) for row in value]

    def clean(self, value: Any) -> list[dict[str, Any]]:
        windows, row_numbers = self.windows_from_rows(self.prepare_value(value))
        errors = limits_errors(windows)
        if errors:
            raise ValidationError([_in_rows(message, row_numbers) for message in errors])
        return windows

    def windows_from_rows(self, rows: list[Row]) -> tuple[list[dict[str, Any]], list[int]]:
        """The windows of the rows not left empty, and the row number (from 1) of each;
        ValidationError naming each row that is only partly filled or not numbers."""
        windows, row_numbers, errors = [], [], []
        for number, row in enumerate(rows, start=1):
            if row.is_empty:
                continue
            try:
                windows.append(_window(row, number))
            except ValidationError as exc:
                errors += exc.messages
            row_numbers.append(number)
        if errors:
            raise ValidationError(errors)
        return windows, row_numbers

    def has_changed(self, initial: Any, data: Any) -> bool:
        if self.disabled:
            return False
        try:
            windows, _ = self.windows_from_rows(self.prepare_value(data))
        except ValidationError:
            return True
        # 60 and 60.0 are the same period, a window without a unit counts requests
        return _comparable(windows) != _comparable(initial)


def _window(row: Row, number: int) -> dict[str, Any]:
    where = f"row {number}"
    errors, numbers = [], {}
    for name in NUMBER_FIELDS:
        text = getattr(row, name).strip()
        if not text:
            errors.append(f"{where}: {name} is required")
            continue
        try:
            numbers[name] = Decimal(text)
        except InvalidOperation:
            errors.append(f"{where}: {name} must be a number")
            continue
        if not numbers[name].is_finite():
            errors.append(f"{where}: {name} must be a number")
    if row.period_unit not in PERIOD_UNITS:
        errors.append(f"{where}: the period's unit must be one of {', '.join(PERIOD_UNITS)}")
    if row.unit not in COUNT_UNITS:
        errors.append(f"{where}: counts must be requests or cost units")
    burst = numbers.get("burst")
    if burst is not None and burst.is_finite() and burst != burst.to_integral_value():
        errors.append(f"{where}: burst must be a whole number")
    if errors:
        raise ValidationError(errors)
    try:  # in Decimal, so 0.1 minutes is 6 seconds, not 6.000000000000001
        period = float(numbers["period"] * PERIOD_UNITS[row.period_unit])
    except ArithmeticError:  # beyond Decimal's range: limits_errors says how long it may be
        period = math.inf
    # out of range either way, and never a million-digit int for a burst typed as 1e999999
    burst = int(min(max(burst, Decimal(0)), Decimal(MAX_BURST + 1)))
    return {"rate": float(numbers["rate"]), "period": period, "burst": burst, "unit": row.unit}


def _in_rows(message: str, row_numbers: list[int]) -> str:
    """limits_errors' "limits[1].period: must be ..." as "row 2: period must be ..." for the
    window of the page's row 2; "... as limits[0]" as "... as row 1"."""

    def row(match: re.Match) -> str:
        index = int(match.group(1))
        number = row_numbers[index] if index < len(row_numbers) else index + 1
        name, colon = match.group(2), match.group(3) or ""
        return f"row {number}: {name} " if name else f"row {number}{colon}"

    return ERROR_AT.sub(row, message)


def _comparable(windows: Any) -> Any:
    if not isinstance(windows, list) or not all(isinstance(w, Mapping) for w in windows):
        return windows
    try:
        return [
            (float(w["rate"]), float(w["period"]), int(w["burst"]), w.get("unit", "requests"))
            for w in windows
        ]
    except (KeyError, TypeError, ValueError):
        return windows
