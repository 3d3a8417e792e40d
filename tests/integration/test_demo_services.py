"""``processor demo`` runs its pipeline as two services, one a gate, routed as a routes
file routes them: each app serves only its own gate, so the demo completes only when
every call reached the service its route names."""

from __future__ import annotations

import io

from rich.console import Console

from processor.demo import demo_routes, run_demo


def test_the_demo_routes_each_gate_to_its_own_service() -> None:
    routes = demo_routes("http://127.0.0.1:1", "http://127.0.0.1:2")
    steps, rank = routes.resolve("resumes", None, 0), routes.resolve("resumes", None, 1)
    assert steps is not None and steps.url == "http://127.0.0.1:1/"
    assert rank is not None and rank.url == "http://127.0.0.1:2/"
    assert routes.resolve("resumes", None, 2) is None
    assert routes.resolve("default", None, 0) is None


async def test_the_demo_completes_through_two_services() -> None:
    out = io.StringIO()
    code = await run_demo(resumes=6, top=2, console=Console(file=out, width=200))
    text = out.getvalue()
    assert code == 0, text
    assert "two services: gate 0 -> http://127.0.0.1:" in text
    assert "gate 1 -> http://127.0.0.1:" in text and "/reduce (rank)" in text
    # The steps app has no reduce and the rank app no gate 0: a call sent to the wrong
    # one fails, and the demo would end failed.
    assert "complete: the inbox spawned 6 resumes" in text, text
