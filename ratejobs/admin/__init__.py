"""The Django admin: where operators submit jobs and see what the rate limits did to them."""

from ratejobs.admin import apis, calls, jobs, signing_keys  # noqa: F401  (their import registers the pages)
