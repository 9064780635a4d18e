"""/admin/cache/feedback.csv: every rating users gave replies, for the operators (staff)."""

from __future__ import annotations

import csv

from django.http import HttpRequest, StreamingHttpResponse
from django.views.decorators.http import require_GET

from chatapp.chat import feedback

# A spreadsheet runs a cell that starts so as a formula; users write these comments.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


class _Echo:
    def write(self, value: str) -> str:
        return value


def _safe(cell: str) -> str:
    return "'" + cell if cell.startswith(_FORMULA_STARTS) else cell


@require_GET
def feedback_csv(request: HttpRequest) -> StreamingHttpResponse:
    writer = csv.writer(_Echo())
    rows = (writer.writerow([_safe(c) for c in row]) for row in feedback.csv_rows())
    response = StreamingHttpResponse(rows, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="feedback.csv"'
    return response
