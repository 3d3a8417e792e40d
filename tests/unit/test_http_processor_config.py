"""HttpProcessorConfig validation and the --handler-header parser (processor/http/config.py)."""

from __future__ import annotations

import dataclasses

import pytest

from processor.http.batch import BatchingHttpProcessor
from processor.http.config import (
    DEFAULT_MAX_RESPONSE_BYTES,
    HttpProcessorConfig,
    parse_header,
    split_userinfo,
)
from processor.http.processor import HttpProcessor
from watcher.errors import ConfigError

SECRET = "Bearer 7op-s3cret-value"


def test_defaults():
    config = HttpProcessorConfig("http://handler:8000/process")
    assert dict(config.headers) == {}
    assert (config.request_timeout, config.connect_timeout) == (30.0, 5.0)
    assert config.max_response_bytes == DEFAULT_MAX_RESPONSE_BYTES == 16 * 1024 * 1024
    assert (config.max_connections, config.verify, config.health_url) == (100, True, None)


@pytest.mark.parametrize("settings, in_message", [
    ({"handler_url": ""}, "handler_url is empty"),
    ({"handler_url": "handler:8000"}, "must start with http:// or https://"),
    ({"handler_url": "ftp://h/x"}, "must start with http:// or https://"),
    ({"handler_url": "http:///path"}, "has no host"),
    ({"handler_url": "http://h:99999/"}, "is malformed"),
    ({"handler_url": "http://h/a b"}, "whitespace or control characters"),
    ({"handler_url": " http://h/"}, "whitespace or control characters"),
    ({"health_url": "tcp://h/health"}, "health_url"),
    ({"health_url": ""}, "health_url is empty"),
    ({"request_timeout": 0}, "request_timeout must be a number of seconds greater than 0"),
    ({"request_timeout": -1.0}, "request_timeout"),
    ({"request_timeout": float("inf")}, "request_timeout"),
    ({"request_timeout": True}, "request_timeout"),
    ({"connect_timeout": 0}, "connect_timeout"),
    ({"max_response_bytes": 0}, "max_response_bytes must be a whole number from 1 or more"),
    ({"max_response_bytes": 1.5}, "max_response_bytes"),
    ({"max_connections": 0}, "max_connections"),
    ({"verify": "/no/such/ca.pem"}, "CA bundle '/no/such/ca.pem' does not exist"),
    ({"verify": 1}, "verify must be true, false or the path of a CA bundle"),
    ({"headers": {"X-Item-Id": "x"}}, "'X-Item-Id' is reserved"),
    ({"headers": {"content-type": "text/plain"}}, "'content-type' is reserved"),
    ({"headers": {"Idempotency-Key": "k"}}, "reserved"),
    ({"headers": {"Bad Name": "v"}}, "not a valid HTTP header name"),
    ({"headers": {"": "v"}}, "not a valid HTTP header name"),
    ({"headers": {"X-A": ""}}, "'X-A' has an empty value"),
    ({"headers": {"X-A": "a\r\nInjected: 1"}}, "'X-A' has an invalid value"),
    ({"headers": {"X-A": "caf\u00e9"}}, "'X-A' has an invalid value"),
    ({"headers": {"X-A": "a", "x-a": "b"}}, "'x-a' is given twice"),
    ({"handler_url": "http://u:p@h/", "headers": {"Authorization": "Bearer t"}},
     "use one of them"),
    ({"handler_url": "http://u@h/", "headers": {"Authorization": "Bearer t"}},
     "use one of them"),
])
def test_invalid_settings_are_config_errors_naming_the_setting(settings, in_message):
    values = {"handler_url": "http://handler:8000/process", **settings}
    with pytest.raises(ConfigError) as caught:
        HttpProcessorConfig(**values)
    assert in_message in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_header_value_errors_never_show_the_value():
    with pytest.raises(ConfigError) as caught:
        HttpProcessorConfig("http://h/", headers={"Authorization": SECRET + "\n"})
    assert SECRET not in str(caught.value)


def test_url_errors_hide_the_password():
    with pytest.raises(ConfigError) as caught:
        HttpProcessorConfig("ftp://bob:pa55word@h/")
    assert "pa55word" not in str(caught.value) and "bob:***@h" in str(caught.value)


def test_valid_settings_are_kept_and_headers_are_a_read_only_copy(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    given = {"Authorization": SECRET, "X-Tenant": "acme corp"}
    config = HttpProcessorConfig("https://h:8443/p?x=1", headers=given, request_timeout=1,
                                 connect_timeout=0.5, max_response_bytes=10,
                                 max_connections=3, verify=str(bundle),
                                 health_url="https://h:8443/healthz")
    given["X-Tenant"] = "changed"
    assert config.headers["X-Tenant"] == "acme corp"
    with pytest.raises(TypeError):
        config.headers["X-New"] = "v"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.request_timeout = 5  # type: ignore[misc]
    assert hash(config) == hash(dataclasses.replace(config))


def test_repr_shows_header_names_but_never_values():
    config = HttpProcessorConfig("http://bob:pa55word@h/p", headers={"X-Api-Key": SECRET})
    for text in (repr(config), str(config)):
        assert "X-Api-Key" in text
        assert SECRET not in text and "7op-s3cret" not in text and "pa55word" not in text


def test_an_unloadable_ca_bundle_fails_when_the_processor_is_built(tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("not a certificate")
    config = HttpProcessorConfig("https://h/", verify=str(bundle))
    with pytest.raises(ConfigError, match="cannot load the CA bundle"):
        HttpProcessor(config)


@pytest.mark.parametrize("spec, expected", [
    ("Authorization: Bearer abc", ("Authorization", "Bearer abc")),
    ("X-Key:v", ("X-Key", "v")),
    ("  X-Key  :  a:b:c  ", ("X-Key", "a:b:c")),
])
def test_parse_header(spec, expected):
    assert parse_header(spec) == expected


@pytest.mark.parametrize("spec, in_message", [
    ("Authorization Bearer abc", "must look like 'Name: value'"),
    (": value", "must look like 'Name: value'"),
    ("X-Key:", "empty value"),
    ("X-Gate: 3", "reserved"),
    ("Bad Name: v", "not a valid HTTP header name"),
])
def test_parse_header_errors(spec, in_message):
    with pytest.raises(ConfigError) as caught:
        parse_header(spec)
    assert in_message in str(caught.value)
    assert "Bearer abc" not in str(caught.value)


def test_transport_choice_is_validated() -> None:
    assert HttpProcessorConfig(handler_url="http://h/").transport == "aiohttp"
    assert HttpProcessorConfig(handler_url="http://h/",
                               transport="httpx").transport == "httpx"
    with pytest.raises(ConfigError, match="transport must be one of aiohttp, httpx"):
        HttpProcessorConfig(handler_url="http://h/", transport="curl")


def test_each_public_name_has_one_import_path() -> None:
    """The configuration and contract names live in processor.http.config and the
    contract's modules (processor.wire.contract and wire_values, wire_errors, wire_reduce) alone;
    processor.http.processor no longer re-exports them, and the handler endpoint has a
    module of its own (no import circle with http_reduce)."""
    import processor.http.config as config_module
    import processor.http.processor as http_processor
    import processor.wire.contract as wire
    import processor.wire.errors as wire_errors
    import processor.wire.reduce as wire_reduce
    import processor.wire.values as wire_values
    from processor.http.endpoint import HandlerEndpoint

    assert not hasattr(http_processor, "__all__")
    assert HandlerEndpoint.__module__ == "processor.http.endpoint"
    for name in ("parse_header", "DEFAULT_MAX_CONNECTIONS", "header_safe",
                 "parse_answer", "parse_error_body", "classify_error",
                 "parse_retry_after", "HandlerError", "MalformedResponseError",
                 "MAX_RETRY_AFTER", "item_context"):
        assert name not in vars(http_processor), name
        homes = [module for module in (config_module, wire, wire_values, wire_errors,
                                       wire_reduce) if name in vars(module)
                 and getattr(getattr(module, name), "__module__", module.__name__)
                 in (module.__name__, None)]
        assert homes, name


@pytest.mark.parametrize("url, expected", [
    ("http://h/p", ("http://h/p", None)),
    ("http://bob:pw@h:8/p?q=1", ("http://h:8/p?q=1", "Basic Ym9iOnB3")),
    ("http://b%40b:p%3Aw@h/", ("http://h/", "Basic YkBiOnA6dw==")),  # percent-decoded
    ("http://bob@h/", ("http://h/", "Basic Ym9iOg==")),
])
def test_split_userinfo(url, expected) -> None:
    assert split_userinfo(url) == expected


@pytest.mark.parametrize("settings, in_message", [
    ({"batch_size": 0}, "handler batch size must be a whole number from 1 or more, got 0"),
    ({"batch_size": True}, "handler batch size"),
    ({"batch_size": 2, "batch_url": "ftp://h/b"},
     "handler batch URL 'ftp://h/b' must start with http:// or https://"),
    ({"batch_size": 2, "batch_url": "http://bob:pa55word@/b"}, "bob:***@"),
])
def test_batch_settings_are_checked(settings, in_message) -> None:
    with pytest.raises(ConfigError) as caught:
        BatchingHttpProcessor(HttpProcessorConfig("http://h/"), **settings)
    assert in_message in str(caught.value)
    assert "pa55word" not in str(caught.value)
