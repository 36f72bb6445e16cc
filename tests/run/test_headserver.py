"""run/headserver.py: the one request to a head server."""

from __future__ import annotations

import pytest
import yaml

from rollfilter.http.testing import ScriptedTransport, scripted_reply
from rollfilter.run.headserver import fetch_config


@pytest.mark.parametrize(("base", "asked"), [
    ("http://h:8000", "http://h:8000/global_config_dict_yaml"),
    ("http://h:8000/p/", "http://h:8000/p/global_config_dict_yaml"),
    ("http://h:8000/?token=t", "http://h:8000/global_config_dict_yaml?token=t"),
    ("http://h:8000/p#part", "http://h:8000/p/global_config_dict_yaml"),
    ("http://h:8000/a%3Fb", "http://h:8000/a%3Fb/global_config_dict_yaml"),
])  # fmt: skip
async def test_the_config_is_asked_under_the_head_server_s_path_with_its_query(base: str, asked: str):
    """The URL given is the head server's base: the config's path goes after its path, not after
    its query or fragment (where the server would never see it), and the query is kept."""
    transport = ScriptedTransport(lambda request: scripted_reply(200, yaml.safe_dump({"a": 1})))
    assert await fetch_config(base, transport) == {"a": 1}
    assert [str(request.url) for request in transport.requests] == [asked]
