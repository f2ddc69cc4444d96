"""A Ctrl-C that Python would drop (its KeyboardInterrupt raised in a gc callback or a
finalizer, where Python can only report it) is delivered again inside ctrl_c_kept."""

import gc
import time

import pytest

from dfairpca.base._interrupts import ctrl_c_kept


class _InterruptedFinalizer:
    def __del__(self):
        raise KeyboardInterrupt  # as the SIGINT handler does when Ctrl-C lands here


def _run_on():
    """Ordinary code, where the interrupt delivered again surfaces (within 60 s, a bound
    on a hang only: it comes in milliseconds)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.001)


def test_a_ctrl_c_in_a_finalizer_is_raised_again_after_it():
    with pytest.raises(KeyboardInterrupt), ctrl_c_kept():
        _InterruptedFinalizer()
        _run_on()


def test_a_ctrl_c_in_a_gc_callback_is_raised_again_after_it():
    calls = []

    def callback(phase, info):
        if not calls:
            calls.append(phase)
            raise KeyboardInterrupt

    gc.callbacks.append(callback)
    try:
        with pytest.raises(KeyboardInterrupt), ctrl_c_kept():
            gc.collect()
            _run_on()
    finally:
        gc.callbacks.remove(callback)
    assert calls == ["start"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_other_unraisable_errors_and_the_hook_are_left_as_they_were():
    import sys

    seen = []
    previous = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        with ctrl_c_kept():
            class Broken:
                def __del__(self):
                    raise ValueError("in a finalizer")

            Broken()
        assert [type(u.exc_value) for u in seen] == [ValueError]
        assert sys.unraisablehook == seen.append
    finally:
        sys.unraisablehook = previous


def test_blocks_closed_out_of_order_in_two_threads_put_the_first_hook_back():
    import sys
    import threading

    original = sys.unraisablehook
    a_open, b_open, a_closed = threading.Event(), threading.Event(), threading.Event()

    def a():
        with ctrl_c_kept():
            a_open.set()
            b_open.wait(60)
        a_closed.set()

    t = threading.Thread(target=a)
    t.start()
    a_open.wait(60)
    with ctrl_c_kept():  # opened after a's, closed after it
        b_open.set()
        a_closed.wait(60)
        assert sys.unraisablehook is not original  # still kept while this block is open
    t.join(60)
    assert sys.unraisablehook is original


def test_a_ctrl_c_dropped_just_before_the_block_ends_is_raised_as_it_ends_not_after():
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c_kept():
            _InterruptedFinalizer()  # dropped; the block ends before its redelivery
    _run_briefly = time.monotonic() + 0.2  # nothing is delivered after the block
    while time.monotonic() < _run_briefly:
        time.sleep(0.001)
