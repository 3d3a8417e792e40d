"""This processor's row in the processors table, without a database: written at the
first lease cycle, every renew interval and when what it serves changes; deleted on a
clean stop; a failed write logged once and tried again, never ending the lease cycle."""

from __future__ import annotations

import logging
from dataclasses import replace

from sqlalchemy.exc import OperationalError

from tests.support.fake_store import FakeStore
from watcher.config import WatcherConfig
from watcher.leasing.registration import Registration
from watcher.pipelines import ServedPipelines, ServedRoute

CONFIG = WatcherConfig(owner_id="me", lease_duration=9.0, poll_interval=0.5)  # renew: 3 s
OCR = ServedPipelines((ServedRoute("ocr", None, True, frozenset({0})),))


async def test_the_row_is_written_first_then_every_renew_interval_and_on_a_change() -> None:
    store = FakeStore()
    registration = Registration(store, "me")
    await registration.keep(100.0, CONFIG)  # the first cycle
    await registration.keep(102.9, CONFIG)  # within the renew interval: nothing
    assert store.asked.registrations == [None]  # --handler-url alone: everything
    await registration.keep(103.0, CONFIG)
    assert store.asked.registrations == [None, None]
    served = replace(CONFIG, pipelines=OCR)  # a routes file reloaded
    await registration.keep(103.1, served)
    assert store.asked.registrations == [None, None, OCR.routes]
    await registration.keep(103.2, served)
    assert len(store.asked.registrations) == 3
    await registration.withdraw()
    assert store.asked.unregistrations == ["me"]


class Failing(FakeStore):
    """A store whose first ``failures`` registrations fail."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failing = failures

    async def processors_register(self, owner, serves, duration) -> None:
        if self.failing:
            self.failing -= 1
            raise OperationalError("INSERT", {}, Exception("gone"))
        await super().processors_register(owner, serves, duration)

    async def processors_unregister(self, owner) -> bool:
        raise OperationalError("DELETE", {}, Exception("gone"))


async def test_a_failed_write_is_logged_once_and_tried_at_the_next_cycle(caplog) -> None:
    store = Failing(2)
    registration = Registration(store, "me")
    with caplog.at_level(logging.INFO, logger="watcher.leasing.registration"):
        await registration.keep(100.0, CONFIG)
        await registration.keep(100.5, CONFIG)  # the next cycle tries again
        assert store.asked.registrations == []
        await registration.keep(101.0, CONFIG)
        assert store.asked.registrations == [None]
        await registration.withdraw()  # left to expire: no error
    actions = [record.getMessage().split()[0] for record in caplog.records]
    assert actions == ["action=processor_register_failed", "action=processor_registered"]
