"""Secrets out of messages: URL redaction and the scrubber (processor/observe/redact.py)."""

from __future__ import annotations

import base64

from processor.observe.redact import Scrubber, header_secrets, redact_url, url_secrets


def test_redact_url_hides_password_and_query_values():
    assert redact_url("http://bob:pw@h:8/p?code=abc&x=1&flag") == (
        "http://bob:***@h:8/p?code=***&x=***&flag")
    assert redact_url("https://bob@h/p") == "https://bob@h/p"
    assert redact_url("http://h/p") == "http://h/p"
    assert redact_url("http://[::1") == "<unparseable URL>"


def test_url_and_header_secrets():
    assert {"p%40ss", "p@ss", "k%2Fy", "k/y"} <= set(url_secrets("http://u:p%40ss@h/?code=k%2Fy"))
    assert "tok123" in header_secrets("Bearer tok123")
    basic = "Basic " + base64.b64encode(b"u:p").decode()
    assert basic.split()[1] in header_secrets(basic)


def test_scrubber_masks_longest_secrets_first_and_ignores_short_values():
    scrub = Scrubber(["abcd", "abcdef", "1", ""])
    assert scrub("x abcdef y abcd z 1") == "x *** y *** z 1"
    assert "abcd" not in repr(scrub)
