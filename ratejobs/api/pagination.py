"""Page-number pagination for every list of the REST API."""

from __future__ import annotations

from rest_framework.pagination import PageNumberPagination


class Pagination(PageNumberPagination):
    page_size = 100
    page_size_query_param = "page_size"
    # A page of calls may carry a stored response body each (up to a MiB): cap the page.
    max_page_size = 1000
