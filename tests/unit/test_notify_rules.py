"""The notifications' pure parts: the signature and its verification, the URL checks,
the internal-address rule, the retry schedule and when to give up, and the event body."""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import replace
from datetime import datetime

import pytest

from processor.client.notifications import MAX_SEQ, check_seqs
from processor.notify.events import RESULT_INLINE_BYTES, event_body, event_row
from processor.notify.policy import NotifyConfig, backoff_delay, gives_up
from processor.notify.signing import sign, verify
from processor.notify.targets import check_notify_url, internal, refusal
from watcher.errors import ConfigError, InvalidInputError
from watcher.records import OutboxEvent, PartitionInfo

SECRET = b"0123456789abcdef0123"
T = datetime(2030, 1, 1, 12, 0, 0)


def test_the_signature_is_hmac_sha256_over_timestamp_dot_body() -> None:
    body = b'{"id":"evt_1"}'
    header = sign(SECRET, 1_900_000_000, body)
    expected = hmac.new(SECRET, b"1900000000." + body, hashlib.sha256).hexdigest()
    assert header == f"t=1900000000,v1={expected}"
    assert verify(SECRET, header, body, now=1_900_000_100)


@pytest.mark.parametrize("change", ["body", "secret", "old", "future", "garbled", "empty"])
def test_a_changed_body_secret_or_time_does_not_verify(change: str) -> None:
    body = b'{"id":"evt_1"}'
    header = sign(SECRET, 1_900_000_000, body)
    now = 1_900_000_000.0
    if change == "body":
        body += b" "
    elif change == "old":
        now += 301
    elif change == "future":
        now -= 301
    elif change == "garbled":
        header = "t=abc,v1=00"
    elif change == "empty":
        header = ""
    secret = b"another-secret-1234" if change == "secret" else SECRET
    assert not verify(secret, header, body, now=now)


@pytest.mark.parametrize("url", ["http://example.com/hook", "https://h.example:8443/a?b=c",
                                 "HTTPS://EXAMPLE.COM/", "http://[::1]:9000/x"])
def test_http_and_https_urls_are_taken(url: str) -> None:
    assert check_notify_url("p", url) == url
    assert check_notify_url("p", None) is None


@pytest.mark.parametrize(("url", "says"), [
    ("ftp://example.com/x", "must be an http:// or https:// URL, got scheme 'ftp'"),
    ("example.com/hook", "got scheme '(none)'"),
    ("http://", "must name a host"),
    ("https://exa mple.com/", "without spaces"),
    ("http://example.com:99999/", "not a valid URL"),
    ("http://example.com:0/", "port 0"),
    ("", "1 to 2000 characters"),
    ("https://example.com/" + "a" * 2000, "1 to 2000 characters"),
    (42, "must be an http(s) URL string, got int"),
])
def test_a_bad_url_is_one_clear_line_naming_the_field(url: object, says: str) -> None:
    with pytest.raises(InvalidInputError) as raised:
        check_notify_url("p", url)
    assert str(raised.value).startswith("notify of partition 'p'")
    assert says in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(("address", "inside"), [
    ("127.0.0.1", True), ("10.1.2.3", True), ("192.168.0.9", True), ("172.16.5.5", True),
    ("169.254.169.254", True), ("100.64.0.1", True), ("0.0.0.0", True), ("::1", True),
    ("fe80::1%eth0", True), ("fd00::1", True), ("::ffff:127.0.0.1", True),
    ("224.0.0.1", True), ("93.184.216.34", False), ("2606:2800:220:1::1", False)])
def test_internal_addresses(address: str, inside: bool) -> None:
    assert internal(address) is inside


@pytest.mark.parametrize(("address", "inside", "why"), [
    ("fec0::1", True, "site-local (deprecated, still routed inside some networks)"),
    ("feff:ffff::1", True, "site-local, the top of fec0::/10"),
    ("2002:a00:1::1", True, "6to4 embedding 10.0.0.1"),
    ("2002:7f00:1::1", True, "6to4 embedding 127.0.0.1"),
    ("2002:a9fe:a9fe::1", True, "6to4 embedding 169.254.169.254"),
    ("2002:808:808::1", True, "6to4 embedding a public address: refused all the same"),
    ("64:ff9b::a00:1", True, "NAT64 to 10.0.0.1"),
    ("64:ff9b::7f00:1", True, "NAT64 to 127.0.0.1"),
    ("64:ff9b::a9fe:a9fe", True, "NAT64 to the metadata service"),
    ("64:ff9b::6440:1", True, "NAT64 to carrier-grade NAT 100.64.0.1"),
    ("64:ff9b::5db8:d822", False, "NAT64 to a public address (93.184.216.34)"),
    ("64:ff9b:1::5db8:d822", True, "local-use NAT64"),
    ("::ffff:10.0.0.1", True, "IPv4-mapped private"),
    ("::ffff:169.254.169.254", True, "IPv4-mapped link-local"),
    ("::ffff:100.64.0.1", True, "IPv4-mapped carrier-grade NAT"),
    ("::ffff:93.184.216.34", False, "IPv4-mapped public"),
    ("::7f00:1", True, "IPv4-compatible 127.0.0.1"),
    ("::5db8:d822", True, "IPv4-compatible, deprecated: refused whatever it embeds"),
    ("2001::1", True, "Teredo"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", True, "Teredo with a server and a client"),
    ("fc00::1", True, "unique local"),
    ("fdff:ffff::1", True, "unique local"),
    ("fe80::1", True, "link-local"),
    ("febf::1", True, "link-local, the top of fe80::/10"),
    ("fe80::1%2", True, "link-local with a zone"),
    ("ff02::1", True, "multicast, link scope"),
    ("ff0e::1", True, "multicast, global scope"),
    ("::", True, "unspecified"),
    ("::1", True, "loopback"),
    ("2001:db8::1", True, "documentation"),
    ("100::1", True, "discard"),
    ("2606:4700:4700::1111", False, "global unicast"),
    ("2a00:1450:4001:80b::200e", False, "global unicast"),
])
def test_the_ipv6_special_ranges(address: str, inside: bool, why: str) -> None:
    assert internal(address) is inside, why


async def test_a_literal_internal_host_is_refused_unless_allowed() -> None:
    refused = await refusal("http://127.0.0.1:8080/x", allow_private=False)
    assert refused is not None and "127.0.0.1" in refused and "--notify-allow-private" in refused
    assert await refusal("http://127.0.0.1:8080/x", allow_private=True) is None
    assert await refusal("http://93.184.216.34/x", allow_private=False) is None


def test_backoff_doubles_up_to_the_cap_with_jitter() -> None:
    assert [backoff_delay(n, 5.0, 3600.0, draw=0.999999) for n in (1, 2, 3)] == pytest.approx(
        [5.0, 10.0, 20.0], rel=1e-5)
    assert backoff_delay(40, 5.0, 3600.0, draw=0.5) == 1800.0
    assert backoff_delay(10_000, 5.0, 3600.0, draw=0.5) == 1800.0  # no overflow
    assert 0.0 <= backoff_delay(3, 5.0, 3600.0) <= 20.0


def test_an_event_is_given_up_after_its_attempts_or_its_age() -> None:
    config = NotifyConfig(max_attempts=3, max_age=60.0)
    assert not gives_up(2, 59.0, config)
    assert gives_up(3, 0.0, config)
    assert gives_up(1, 60.0, config)


def test_a_short_secret_and_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        NotifyConfig(secret=b"short")
    with pytest.raises(ConfigError, match="--notify-attempts"):
        NotifyConfig(max_attempts=0)
    assert "secret" not in repr(NotifyConfig(secret=SECRET))


def _event(status: str = "complete") -> OutboxEvent:
    return OutboxEvent(seq=1, event_id="evt_x", partition_id="p", target="https://e.com",
                       status=status, gate=2, state="pending", attempts=1, version=2,
                       next_at=T, created_at=T, updated_at=T, now=T)


def test_the_body_says_what_ended_and_inlines_a_small_json_result() -> None:
    info = PartitionInfo(id="p", status="complete", gate=2, owner="", until=T, version=9,
                         counts={"failed": 1, "complete": 3}, created_at=T,
                         result=b'{"sum": 6}', last_error=None, key="acme")
    body = json.loads(event_body(_event(), info))
    assert body == {"id": "evt_x", "type": "partition.complete", "partition_id": "p",
                    "status": "complete", "gate": 2, "ended_at": "2030-01-01T12:00:00Z",
                    "counts": {"complete": 3, "failed": 1}, "result": {"sum": 6},
                    "result_included": True, "result_size": 10, "last_error": None,
                    "created_at": "2030-01-01T12:00:00Z", "key": "acme",
                    "partition_found": True}


def test_a_large_or_raw_result_is_left_out_with_its_size() -> None:
    for result in (b"x" * (RESULT_INLINE_BYTES + 1), b"\xff not json"):
        info = PartitionInfo(id="p", status="failed", gate=0, owner="", until=T, version=1,
                             result=result, last_error="boom")
        body = json.loads(event_body(_event("failed"), info))
        assert body["result"] is None and body["result_included"] is False
        assert body["result_size"] == len(result) and body["last_error"] == "boom"


def test_a_deleted_partitions_event_says_what_the_outbox_holds() -> None:
    body = json.loads(event_body(_event("cancelled"), None))
    assert body["status"] == "cancelled" and body["type"] == "partition.cancelled"
    assert body["partition_found"] is False and body["counts"] is None


def test_an_events_row_masks_its_url() -> None:
    event = replace(_event("failed"), target="https://ops:pw@hooks.example.com/h?token=abc&plain")
    row = event_row(event)
    assert row["target"] == "https://ops:***@hooks.example.com/h?token=***&plain"
    assert "pw" not in str(row) and "abc" not in str(row)


@pytest.mark.parametrize("seqs", [[], [1], (1, MAX_SEQ), [7, 7]])
def test_event_numbers_to_send_again(seqs: list[int]) -> None:
    assert check_seqs(seqs) == list(seqs)


@pytest.mark.parametrize(("seqs", "says"), [
    ("12", "a list of whole numbers, got str"), (12, "got int"), (None, "got NoneType"),
    ({1: 1}, "got dict"), ([True], "got True"), ([1.0], "got 1.0"), (["1"], "got '1'"),
    ([0], "got 0"), ([-3], "got -3"), ([MAX_SEQ + 1], f"from 1 to {MAX_SEQ}, got"),
])
def test_bad_event_numbers_are_refused(seqs: object, says: str) -> None:
    with pytest.raises(InvalidInputError, match="notification numbers must be") as caught:
        check_seqs(seqs)
    assert says in str(caught.value)
