"""Database URL secrets: every place a driver takes a password is masked, and a URL
that cannot be split safely is refused without being echoed."""

from __future__ import annotations

import pytest

from watcher.errors import ConfigError
from watcher.store.db.urls import parse_database_url, redact_url


@pytest.mark.parametrize(("raw", "shown"), [
    # Shown as given: the scheme the user wrote, not the driver's.
    ("postgresql://u:pw1234@h/db", "postgresql://u:***@h/db"),
    ("postgres://u@h/db?password=pw1234", "postgres://u@h/db?password=***"),
    ("postgresql://u@h/db?sslmode=require&sslpassword=pw1234",
     "postgresql://u@h/db?sslmode=require&sslpassword=***"),
    ("postgresql://u@h/db?application_name=x&token=pw1234",
     "postgresql://u@h/db?application_name=x&token=***"),
    ("mysql://u@h/db?password=pw1234", "mysql://u@h/db?password=***"),
    ("mssql://u:pw1234@h/db?tds_version=7.4", "mssql://u:***@h/db?tds_version=7.4"),
])
def test_redacted_urls_mask_every_secret(raw: str, shown: str) -> None:
    url = parse_database_url(raw)
    assert url.redacted() == shown
    assert "+" not in url.redacted().split("://")[0]
    assert "pw1234" not in repr(url) and "pw1234" not in str(url)
    assert url.scrub("connect failed: pw1234 and pw%31234") == "connect failed: *** and pw%31234"
    assert "pw1234" not in redact_url(raw)


def test_a_url_is_shown_as_given_not_as_the_driver_url() -> None:
    url = parse_database_url("sqlite:///x.db")
    assert (url.redacted(), str(url)) == ("sqlite:///x.db", "sqlite:///x.db")
    assert url.async_url.drivername == "sqlite+aiosqlite"


def test_percent_encoded_secrets_are_scrubbed_decoded_and_raw() -> None:
    url = parse_database_url("postgresql://u@h/db?password=a%2Bb%40c")
    assert url.scrub("saw a+b@c") == "saw ***"


@pytest.mark.parametrize("raw", ["postgresql://u:p@ss@h/db", "mysql://u@x:y@z@h/db?k=1",
                                 "postgresql://u:p@ss@h"])
def test_an_ambiguous_userinfo_is_refused_without_echoing_it(raw: str) -> None:
    with pytest.raises(ConfigError, match="%40") as refused:
        parse_database_url(raw)
    assert "ss@h" not in str(refused.value) and "p@ss" not in str(refused.value)
    assert redact_url(raw) == "<unparseable database URL>"


def test_an_encoded_at_sign_is_a_valid_password() -> None:
    url = parse_database_url("postgresql://u:p%40ss@h/db")
    assert url.async_url.password == "p@ss" and url.async_url.host == "h"
