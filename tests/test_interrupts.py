"""A Ctrl-C that Python would drop (its KeyboardInterrupt raised in a gc callback or a
finalizer, where Python can only report it) is delivered again inside ctrl_c_kept; one that
lands before distributed's event loop started the interrupted call logs no traceback."""

import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import time

import pytest

from dfairpca.base._interrupts import ctrl_c_kept
from dfairpca.cluster._signals import _dropping, _early_sync_cancels


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


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


def _ctrl_c_once_waiting_in(function, thread_id):
    """SIGINT to this process once thread ``thread_id`` waits in ``function``'s ``wait``
    (distributed's sync waits for its call there, after queueing it)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread_id)
        while frame is not None and not (frame.f_code.co_name == "wait" and frame.f_back is not None
                                         and frame.f_back.f_code.co_name == function):
            frame = frame.f_back
        if frame is not None:
            os.kill(os.getpid(), signal.SIGINT)
            return
        time.sleep(0.001)


def _ctrl_c_before_the_loop_starts_the_call(records):
    """distributed's blocking ``sync`` interrupted by a real SIGINT while its event loop is
    busy (as on a loaded machine), so that its cancel callback runs before the call began;
    returns tornado's records of callback errors."""
    from distributed.utils import LoopRunner, sync

    logger = logging.getLogger("tornado.application")
    logger.addHandler(records)
    runner = LoopRunner(asynchronous=False)
    runner.start()
    try:
        busy, free = threading.Event(), threading.Event()
        runner.loop.add_callback(lambda: (busy.set(), free.wait(60)))
        assert busy.wait(30)
        threading.Thread(target=_ctrl_c_once_waiting_in, args=("sync", threading.get_ident()),
                         daemon=True).start()

        async def call():
            return None

        try:
            with pytest.raises(KeyboardInterrupt):
                sync(runner.loop, call)
        finally:
            free.set()
        # the loop runs the cancel callback once it is free; an event, not a wait: the
        # next callback queued after it runs only after it
        done = threading.Event()
        runner.loop.add_callback(done.set)
        assert done.wait(30)
    finally:
        runner.stop()
        logger.removeHandler(records)
    return [r for r in records.records if r.exc_info]


def _cancel_errors(records):
    return [r for r in records if r.exc_info and "sync.<locals>.cancel" in r.getMessage()]


def test_distributed_cancel_before_its_call_started_is_a_logged_name_error():
    # what the filter below drops is a real record of distributed's: if this fails, the
    # filter is no longer needed
    errors = _cancel_errors(_ctrl_c_before_the_loop_starts_the_call(_Records()))
    assert [type(r.exc_info[1]) for r in errors] == [NameError]
    assert _early_sync_cancels(errors[0])


def test_a_ctrl_c_before_distributed_started_the_call_logs_no_traceback():
    dropped = []

    def counted(record):
        hit = _early_sync_cancels(record)
        dropped.append(hit)
        return hit

    with _dropping("tornado.application", counted):
        errors = _ctrl_c_before_the_loop_starts_the_call(_Records())
    assert sum(dropped) == 1  # the record came, and was dropped
    assert _cancel_errors(errors) == []


def test_other_callback_errors_are_still_logged():
    try:
        raise NameError("a bug of the caller's")
    except NameError:
        record = logging.LogRecord("tornado.application", logging.ERROR, __file__, 1,
                                   "Exception in callback", None, sys.exc_info())
    assert not _early_sync_cancels(record)
    assert not _early_sync_cancels(logging.LogRecord("tornado.application", logging.ERROR,
                                                     __file__, 1, "no exception", None, None))


def _drop_all(record):
    return True


def test_a_block_dropping_records_ends_with_the_logger_as_it_was():
    # also after a Ctrl-C: connect() leaves the program's logging as it found it
    name = "dfairpca.test.dropping"
    logger = logging.getLogger(name)
    for end in (None, RuntimeError, KeyboardInterrupt):
        with contextlib.suppress(RuntimeError, KeyboardInterrupt), _dropping(name, _drop_all):
            assert len(logger.filters) == 1
            if end is not None:
                raise end
        assert logger.filters == []
