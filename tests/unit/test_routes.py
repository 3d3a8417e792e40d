"""The routes file: parsing, the errors it reports (one line each, with its line number),
route resolution and the places a processor serves. Pure: no I/O."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from processor.http.routes import RoutesError, Service, parse_routes, single_route
from watcher.pipelines import ServedPipelines, ServedRoute

TWO_PIPELINES = """\
[[pipeline]]
name = "invoices"
current = "v2"

[[pipeline.route]]
gate = 0
url = "http://ocr:8000/process"
health_url = "http://ocr:8000/healthz"

[[pipeline.route]]
gate = "*"
url = "http://classify-v1:8000/process"

[[pipeline.route]]
version = "v2"
gate = 1
url = "http://classify-v2:8000/process"
reduce_url = "http://rank:8000/reduce"
timeout = 60
batch_size = 16
headers = { Authorization = "Bearer secret-token" }

[[pipeline]]
name = "resumes"

[[pipeline.route]]
gate = "*"
url = "https://resumes.example/process"
"""


def test_a_place_goes_to_its_version_then_its_pipeline_then_every_gate() -> None:
    routes = parse_routes(TWO_PIPELINES)
    ocr = routes.resolve("invoices", "v1", 0)
    assert ocr is not None and ocr.url == "http://ocr:8000/process"
    assert ocr.health_url == "http://ocr:8000/healthz"
    # No v1 table: its gate 1 falls back to the pipeline's "*" route.
    assert routes.resolve("invoices", "v1", 1) == routes.resolve("invoices", None, 5)
    v2 = routes.resolve("invoices", "v2", 1)
    assert v2 == Service("http://classify-v2:8000/process", None, "http://rank:8000/reduce",
                         None, 60.0, (("Authorization", "Bearer secret-token"),), 16)
    # No version: the current one (v2).
    assert routes.resolve("invoices", None, 1) == v2
    assert routes.resolve("resumes", "anything", 7).url == "https://resumes.example/process"
    assert routes.resolve("crawls", None, 0) is None
    assert len(routes.services()) == 4
    assert "secret-token" not in repr(v2)


def test_the_places_served_are_those_routed() -> None:
    served = parse_routes(TWO_PIPELINES).served()
    assert served.current == {"invoices": "v2"}
    assert served.serves("invoices", "v9", 3)  # the pipeline's "*" serves every version
    assert served.serves("resumes", None, 0)
    assert not served.serves("crawls", None, 0)
    assert served.pin("invoices", None) == "v2"
    assert served.pin("invoices", "v1") is None
    assert served.pin("resumes", None) is None


@pytest.mark.parametrize(("route", "pipeline", "version", "gate", "serves"), [
    (ServedRoute("a", None, True, None), "a", "v1", 9, True),
    (ServedRoute("a", None, True, None), "b", None, 0, False),
    (ServedRoute("a", "v2", True, frozenset({0, 1})), "a", None, 1, True),
    (ServedRoute("a", "v2", False, frozenset({0, 1})), "a", None, 1, False),
    (ServedRoute("a", "v2", True, frozenset({0, 1})), "a", "v2", 2, False),
    (ServedRoute("a", "v2", True, frozenset({0, 1})), "a", "v1", 0, False),
])
def test_a_served_route_serves_its_pipeline_version_and_gates(
        route: ServedRoute, pipeline: str, version: str | None, gate: int,
        serves: bool) -> None:
    assert route.serves(pipeline, version, gate) is serves
    assert ServedPipelines((route,)).serves(pipeline, version, gate) is serves


def test_versions_without_a_pipeline_wide_route_serve_only_themselves() -> None:
    routes = parse_routes("""\
[[pipeline]]
name = "p"
current = "v2"
[[pipeline.route]]
version = "v1"
gate = "*"
url = "http://old:8000/"
[[pipeline.route]]
version = "v2"
gate = 0
url = "http://new:8000/"
""")
    served = routes.served()
    assert served.serves("p", "v1", 4) and served.serves("p", "v2", 0)
    assert served.serves("p", None, 0)  # unpinned: takes v2, the current one
    assert not served.serves("p", "v2", 1)  # v2 routes gate 0 only
    assert not served.serves("p", "v3", 0)
    assert routes.resolve("p", "v3", 0) is None


def test_handler_url_alone_is_the_default_pipeline_every_gate() -> None:
    routes = single_route("http://handler:8000/")
    assert routes.resolve("default", None, 12) == Service("http://handler:8000/")
    assert routes.served().serves("default", "v1", 0)
    assert not routes.served().serves("other", None, 0)


def test_every_error_is_a_line_naming_its_line_number() -> None:
    text = """\
color = "blue"

[[pipeline]]
name = "invoices"
colour = "red"

[[pipeline.route]]
gate = 0

[[pipeline.route]]
gate = 1
url = "ftp://files/x"

[[pipeline.route]]
gate = 2
url = "http://ok:8000/"
timout = 5

[[pipeline]]
name = "invoices"
[[pipeline.route]]
gate = "*"
url = "http://ok:8000/"
"""
    with pytest.raises(RoutesError) as raised:
        parse_routes(text, source="routes.toml")
    errors = raised.value.errors
    assert errors == (
        "routes.toml:1: unknown key 'color'; a routes file holds [[pipeline]] tables",
        "routes.toml:5: unknown key 'colour' in a pipeline; use current, name, route",
        "routes.toml:7: pipeline 'invoices' gate 0: the route has no url; give the "
        "handler's URL, such as url = \"http://ocr:8000/process\"",
        "routes.toml:10: pipeline 'invoices' gate 1: url 'ftp://files/x' must start with "
        "http:// or https://, such as http://handler:8000/process",
        "routes.toml:17: pipeline 'invoices': unknown key 'timout' in a route; use "
        "batch_size, batch_url, gate, headers, health_url, reduce_url, timeout, url, version",
        "routes.toml:19: pipeline 'invoices' is given twice; give each pipeline one "
        "[[pipeline]] table",
    )


@pytest.mark.parametrize(("text", "expected"), [
    ("[[pipeline]]\nname = \"p\"\n[[pipeline.route]]\ngate = 0\nurl = \"http://h/\"\n"
     "[[pipeline]]\nname = \"p\"\n", "f:6: pipeline 'p' is given twice"),
    ("[[pipeline]]\nname = \"x y\"\n[[pipeline.route]]\ngate = 0\nurl = \"http://h/\"\n",
     "f:1: pipeline name 'x y' must be ASCII letters"),
    ("[[pipeline]]\nname = \"p\"\ncurrent = \"v9\"\n[[pipeline.route]]\nversion = \"v1\"\n"
     "gate = 0\nurl = \"http://h/\"\n", "f:1: pipeline 'p': current version 'v9' has no route"),
    ("[[pipeline]]\nname = \"p\"\n[[pipeline.route]]\ngate = -1\nurl = \"http://h/\"\n",
     "f:3: pipeline 'p': gate must be a whole number"),
    ("[[pipeline]]\nname = \"p\"\n[[pipeline.route]]\ngate = 0\nurl = \"http://h/\"\n"
     "[[pipeline.route]]\ngate = 0\nurl = \"http://i/\"\n",
     "f:6: pipeline 'p' gate 0: a second route for this gate"),
    ("[[pipeline]]\nname = \"p\"\n[[pipeline.route]]\ngate = 0\nurl = \"http://h/\"\n"
     "headers = { Host = \"x\" }\n", "f:3: pipeline 'p' gate 0: handler header 'Host' is reserved"),
    ("[[pipeline]]\nname = \"p\"\n", "f:1: pipeline 'p' has no [[pipeline.route]]"),
    ("", "f: no [[pipeline]] table"),
    ("[[pipeline]\n", "f: not valid TOML: "),
])
def test_a_bad_routes_file_says_what_and_where(text: str, expected: str) -> None:
    with pytest.raises(RoutesError) as raised:
        parse_routes(text, source="f")
    assert raised.value.errors[0].startswith(expected), raised.value.errors


def test_the_reference_shows_the_errors_its_broken_file_gives() -> None:
    """docs/reference/routes.md's broken file (marked ``broken``) gives exactly the lines
    its next block (marked ``errors``) shows, in that order."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "routes.md"
            ).read_text(encoding="utf-8")
    blocks = dict(re.findall(r"<!-- test: (\w+) -->\n```\w*\n(.*?)```", page, re.S))
    with pytest.raises(RoutesError) as raised:
        parse_routes(blocks["broken"], source="routes.toml")
    assert list(raised.value.errors) == blocks["errors"].splitlines()
