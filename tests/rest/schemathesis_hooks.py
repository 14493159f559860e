"""Loaded by the schemathesis run of test_schemathesis.py (SCHEMATHESIS_HOOKS): job uploads are
JSON lines, sent as the text schemathesis generates for them."""

from __future__ import annotations

import schemathesis

schemathesis.serializer.alias("application/x-ndjson", "text/plain")
