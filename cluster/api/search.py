"""The API's ``?search=`` filter: DRF's, with a refused term named by its parameter."""

from __future__ import annotations

from rest_framework import filters
from rest_framework.exceptions import ValidationError


class SearchFilter(filters.SearchFilter):
    def get_search_terms(self, request):
        try:
            return super().get_search_terms(request)
        except ValidationError as exc:  # a NUL byte: DRF says why, but not of which parameter
            raise ValidationError({self.search_param: exc.detail}) from exc
