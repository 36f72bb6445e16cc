"""routing.py: which agent a row goes to."""

from __future__ import annotations

import httpx

from rollfilter.config import Config
from rollfilter.outcomes import AttemptFailure
from rollfilter.routing import Router


def test_router_prefers_named_endpoint_then_url():
    config = Config(url="http://d/run", endpoints={"a": ("http://a/run",)})
    router = Router(config)
    route = router.route("a")
    assert not isinstance(route, AttemptFailure)
    assert route.replicas[0].url == httpx.URL("http://a/run")
    route = router.route("other")
    assert not isinstance(route, AttemptFailure)
    assert route.name is None
    assert isinstance(Router(Config(endpoints={"a": ("http://a/run",)})).route(None), AttemptFailure)
