"""Which places the live processors serve (watcher.rules.served.places): tables of cases,
no database."""

from __future__ import annotations

import pytest

from watcher.pipelines import ServedRoute
from watcher.reports import PlaceCount
from watcher.rules.served.places import served, serves_of, serves_text, unserved

OCR_GATE_0 = (ServedRoute("ocr", None, True, frozenset({0})),)
INVOICES_V2 = (ServedRoute("invoices", "v2", False, None),)
INVOICES_CURRENT_V2 = (ServedRoute("invoices", "v2", True, frozenset({0, 1})),)


@pytest.mark.parametrize(("fleet", "place", "expected"), [
    ([], ("default", None, 0), False),  # nobody runs
    ([None], ("anything", "v9", 12), True),  # one serving everything covers all
    ([OCR_GATE_0, None], ("crawl", None, 3), True),
    ([OCR_GATE_0], ("ocr", None, 0), True),
    ([OCR_GATE_0], ("ocr", "v7", 0), True),  # a table without a version: every version
    ([OCR_GATE_0], ("ocr", None, 1), False),  # another gate
    ([OCR_GATE_0], ("default", None, 0), False),  # another pipeline
    ([INVOICES_V2], ("invoices", "v2", 5), True),  # "*": every gate
    ([INVOICES_V2], ("invoices", "v1", 0), False),  # another version
    ([INVOICES_V2], ("invoices", None, 0), False),  # not pinned: v2 is not its current
    ([INVOICES_CURRENT_V2], ("invoices", None, 1), True),  # pinned to v2 at its lease
    ([INVOICES_CURRENT_V2], ("invoices", None, 2), False),
    ([OCR_GATE_0, INVOICES_V2], ("invoices", "v2", 0), True),  # any processor will do
    ([()], ("default", None, 0), False),  # a row this version could not read: nothing
])
def test_a_place_is_served_when_some_live_processor_serves_it(fleet, place, expected) -> None:
    assert served(*place, fleet) is expected


def test_the_unserved_places_are_those_no_processor_serves_in_order() -> None:
    places = [PlaceCount("ocr", None, 1, 4), PlaceCount("ocr", None, 0, 9),
              PlaceCount("invoices", "v2", 0, 2), PlaceCount("invoices", "v1", 3, 1),
              PlaceCount("invoices", None, 0, 5), PlaceCount("default", None, 0, 7)]
    assert unserved(places, [OCR_GATE_0, INVOICES_V2]) == [
        PlaceCount("default", None, 0, 7), PlaceCount("invoices", None, 0, 5),
        PlaceCount("invoices", "v1", 3, 1), PlaceCount("ocr", None, 1, 4)]
    assert unserved(places, [OCR_GATE_0, None]) == []
    assert unserved([], []) == []


@pytest.mark.parametrize("serves", [
    None, (), OCR_GATE_0, INVOICES_V2 + OCR_GATE_0,
    (ServedRoute("p", "v.1-x", False, frozenset({0, 3, 2**31 - 1})),),
])
def test_what_a_processor_serves_reads_back_as_written(serves) -> None:
    text = serves_text(serves)
    assert (text is None) == (serves is None)
    assert serves_of(text) == serves


@pytest.mark.parametrize(("text", "expected"), [
    ("not json", ()),
    ('{"pipeline": "ocr"}', ()),
    ('[{"pipeline": "ocr", "version": null, "null_version": true, "gates": [0]}, 7,'
     ' {"pipeline": 3}, {"pipeline": "x", "gates": ["0"]}, {"pipeline": "x", "gates": [true]},'
     ' {"pipeline": "x", "null_version": "yes"}, {"pipeline": "y", "version": 2}]', OCR_GATE_0),
    ('[{"pipeline": "ocr", "gates": [0], "weight": 3}]', OCR_GATE_0),  # newer keys: ignored
])
def test_a_table_that_cannot_be_read_is_left_out(text, expected) -> None:
    assert serves_of(text) == expected
