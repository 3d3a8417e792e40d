"""Ctrl-C in ``status --watch``: a request to stop that never interrupts a read."""

from __future__ import annotations

import os
import signal

import pytest

from processor.cli.watching import CtrlC


def test_ctrl_c_sets_the_flag_and_wakes_the_wait() -> None:
    before = signal.getsignal(signal.SIGINT)
    with CtrlC() as ctrl_c:
        assert ctrl_c.sleep(0) is False
        os.kill(os.getpid(), signal.SIGINT)  # handled at once, in this (the main) thread
        assert ctrl_c.stopped is True
        assert ctrl_c.sleep(3600) is True  # returns at once: it has come
    assert signal.getsignal(signal.SIGINT) is before


def test_a_second_ctrl_c_interrupts() -> None:
    with CtrlC() as ctrl_c, pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        assert ctrl_c.stopped
        os.kill(os.getpid(), signal.SIGINT)


def test_an_ignored_sigint_stays_ignored() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with CtrlC() as ctrl_c:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert ctrl_c.sleep(0) is False
    finally:
        signal.signal(signal.SIGINT, previous)
