"""An API answer that says the database failed is logged for the operator, one line."""

from __future__ import annotations

import logging

from processor.api.dispatch import error_response
from processor.api.problems import ApiError


def test_a_503_for_the_database_is_logged_once_on_one_line(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="processor.api.dispatch")
    response = error_response(ApiError(503, "database_unavailable",
                                       "the database failed:\nconnection reset"))
    assert response.status_code == 503
    lines = [record.getMessage() for record in caplog.records]
    assert lines == ["action=api_database_unavailable status=503 "
                     "error=the database failed: connection reset"]


def test_other_errors_are_the_callers_and_are_not_logged(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="processor.api.dispatch")
    error_response(ApiError(409, "already_completed", "the wait is over"))
    assert caplog.records == []
