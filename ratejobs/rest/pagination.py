"""Page-number pagination for every list of the REST API."""

from __future__ import annotations

import re
from typing import Any

from django.core.paginator import Paginator
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request

# What the schema calls an integer in a query string; int() would also take " 7", "+7", "7_0"
# and other scripts' digits.
_DIGITS = re.compile(r"[0-9]+")


class Pagination(PageNumberPagination):
    page_size = 100
    page_size_query_param = "page_size"
    # Rows a page may hold; the bytes of the calls' response bodies on a page have their own
    # budget, RATEJOBS_MAX_PAGE_BYTES (see JobCallListView).
    max_page_size = 1000
    # Page numbers only: DRF would also take "last".
    last_page_strings = ()

    def get_page_number(self, request: Request, paginator: Paginator) -> Any:
        """The page asked for, 1 when none; anything but a page number is a 404, as a page
        past the last one is (DRF would read an empty or malformed page as the first)."""
        given = request.query_params.get(self.page_query_param)
        if given is None:
            return 1
        if not _DIGITS.fullmatch(given):
            raise NotFound(f"Invalid page: {self.page_query_param} must be a page number.")
        return given

    def get_page_size(self, request: Request) -> int:
        """The page size asked for, capped at max_page_size; a 400 for anything but a whole
        number of 1 or more (DRF would silently use the default)."""
        given = request.query_params.get(self.page_size_query_param)
        if given is None:
            return self.page_size
        if not _DIGITS.fullmatch(given) or int(given) < 1:
            raise ValidationError(
                {self.page_size_query_param: ["A whole number of 1 or more is required."]}
            )
        return min(int(given), self.max_page_size)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        page, size = super().get_schema_operation_parameters(view)
        page["schema"]["minimum"] = 1
        page["description"] = "A page number, from 1; past the last page: 404."
        size["schema"]["minimum"] = 1
        size["description"] = (
            f"Results per page: {self.page_size} unless given, at most {self.max_page_size} "
            "(a larger number gets that many)."
        )
        return [page, size]
