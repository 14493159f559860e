"""Page-number pagination for every list of the REST API."""

from __future__ import annotations

from rest_framework.pagination import PageNumberPagination


class Pagination(PageNumberPagination):
    page_size = 100
    page_size_query_param = "page_size"
    # Rows a page may hold; the bytes of the calls' response bodies on a page have their own
    # budget, RATEJOBS_MAX_PAGE_BYTES (see JobCallListView).
    max_page_size = 1000
