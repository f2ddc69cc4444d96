"""Progress of a fit: whole lines without a terminal (no carriage return, a few per phase),
a bar and a redrawn phase line on one; the pass and every eigensolve are reported."""

import io
import os
import pty
import select
import time

import dask.array as da
import pytest
from scheduler_tasks import feeds

import dfairpca
from dfairpca.base import progress
from dfairpca.base.progress import LineBar, phase, progress_bar, reporting


def _fit(X, z, stream=None, **kw):
    if stream is None:
        return dfairpca.FairPCA(4, progress=True, **kw).fit(X, sensitive_features=z)
    with reporting(True, stream):
        return dfairpca.FairPCA(4, progress=True, **kw).fit(X, sensitive_features=z)


def _assert_log(text: str, max_lines: int = 12):
    assert "\r" not in text and "\x1b" not in text, repr(text)
    lines = text.splitlines()
    assert 0 < len(lines) <= max_lines, text
    assert any(line.startswith("pass") for line in lines), text
    assert any(line.startswith("eigensolve: top 4 of 30 dimensions") and "done in" in line
               for line in lines), text


@pytest.mark.parametrize("dask_input", [False, True], ids=["numpy", "dask"])
def test_a_fit_with_progress_into_a_log_writes_whole_lines_only(two_groups, dask_input):
    X, z = two_groups(3000, 30)
    if dask_input:
        X = da.from_array(X, chunks=(250, 30))
    buf = io.StringIO()
    _fit(X, z, buf)
    _assert_log(buf.getvalue())


def test_progress_true_writes_to_stderr_which_is_not_a_terminal_here(two_groups, capsys):
    X, z = two_groups(2000, 30)
    _fit(X, z)
    out = capsys.readouterr()
    assert out.out == ""
    _assert_log(out.err)


def test_no_progress_writes_nothing(two_groups, capsys):
    X, z = two_groups(2000, 30)
    dfairpca.FairPCA(4).fit(da.from_array(X, chunks=(250, 30)), sensitive_features=z)
    assert capsys.readouterr().err == ""


def test_a_checkpointed_pass_draws_one_bar_not_one_per_segment(two_groups, tmp_path):
    X, z = two_groups(4000, 30)
    buf = io.StringIO()
    with reporting(True, buf):
        dfairpca.FairPCA(4, progress=True).fit(da.from_array(X, chunks=(100, 30)),
                                               sensitive_features=z, checkpoint=tmp_path / "ck")
    text = buf.getvalue()
    _assert_log(text)
    passes = [line for line in text.splitlines() if line.startswith("pass")]
    assert passes[0] == "pass: 40 chunks" and passes[-1].startswith("pass: 40 of 40 chunks done in")
    assert len(passes) <= 5, text


def test_a_line_bar_writes_each_quarter_once_then_the_total():
    buf = io.StringIO()
    bar = LineBar(8, "pass", "block", buf)
    for _ in range(8):
        bar.update()
    bar.close()
    bar.close()
    lines = buf.getvalue().splitlines()
    assert lines[0] == "pass: 8 blocks"
    assert [line.split(" (")[0] for line in lines[1:4]] == ["pass: 25%", "pass: 50%", "pass: 75%"]
    assert lines[4].startswith("pass: 8 of 8 blocks done in") and len(lines) == 5


def test_a_long_phase_in_a_log_says_it_still_runs(monkeypatch):
    monkeypatch.setattr(progress, "HEARTBEAT_SECONDS", 0.2)
    buf = io.StringIO()
    with reporting(True, buf), phase("eigensolve: top 1 of 2 dimensions (LAPACK eigh)"):
        time.sleep(0.7)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "eigensolve: top 1 of 2 dimensions (LAPACK eigh) ..."
    assert any("still running after" in line for line in lines[1:-1]) and len(lines) <= 6
    assert "\r" not in buf.getvalue() and lines[-1].startswith(
        "eigensolve: top 1 of 2 dimensions (LAPACK eigh): done in")


def test_a_phase_that_raises_says_it_stopped():
    buf = io.StringIO()
    with pytest.raises(KeyError), reporting(True, buf), phase("basis"):
        raise KeyError("x")
    assert buf.getvalue().splitlines()[-1].startswith("basis: stopped in")


def test_on_a_terminal_a_phase_is_redrawn_every_second_and_the_pass_is_a_bar(two_groups):
    """A pseudo-terminal: the eigensolve's line moves while it runs (never silent for
    more than a second), the pass shows tqdm's bar."""
    master, slave = pty.openpty()
    tty = os.fdopen(slave, "w", encoding="utf-8")
    try:
        X, z = two_groups(2000, 30)
        _fit(X, z, tty)
        with reporting(True, tty), phase("eigensolve: slow"):
            time.sleep(2.3)
        tty.flush()
        chunks = []
        while select.select([master], [], [], 0.5)[0]:
            chunks.append(os.read(master, 1 << 16))
        text = b"".join(chunks).decode("utf-8", "replace")
    finally:
        tty.close()
        os.close(master)
    assert "\rpass: 100%|" in text, repr(text)
    assert "\reigensolve: slow (1.0 s)" in text and "\reigensolve: slow (2.0 s)" in text, repr(text)
    assert "eigensolve: slow: done in" in text


def test_without_a_report_there_is_no_bar():
    assert progress_bar(3, "pass") is None
    with reporting(True, io.StringIO()), reporting(False):
        assert progress_bar(3, "pass") is None


def test_a_fit_on_a_distributed_cluster_reports_the_scheduler_count_in_lines(two_groups, client):
    X, z = two_groups(3000, 30)
    buf = io.StringIO()
    _fit(da.from_array(X, chunks=(250, 30)), z, buf)
    _assert_log(buf.getvalue())
    assert "tasks done in" in buf.getvalue()


def test_a_pass_that_ends_before_its_bar_follows_it_leaves_nothing_following(
        two_groups, client, monkeypatch):
    """The scheduler's count of a pass waits for the pass's key to be known; a bar whose
    thread starts late (a loaded machine) must still find it, end, and leave no coroutine
    on the scheduler polling for ever for a key already released (one that the closing
    cluster would cancel, with a traceback, after the fit's own message)."""
    import threading

    from dfairpca.engine import _engine

    ended = threading.Event()
    follow = _engine._follow

    def late(*args):
        time.sleep(1.0)  # the pass is gathered (and its bar given up on) before this starts
        try:
            follow(*args)
        finally:
            ended.set()

    monkeypatch.setattr(_engine, "BAR_END_SECONDS", 0.0)
    monkeypatch.setattr(_engine, "_follow", late)
    X, z = two_groups(600, 10)
    _fit(da.from_array(X, chunks=(300, 10)), z, io.StringIO())
    assert ended.wait(30), "the bar's thread still waits for a pass that ended"

    deadline = time.monotonic() + 10
    while client.run_on_scheduler(feeds) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.run_on_scheduler(feeds) == 0


@pytest.fixture
def followed(monkeypatch):
    """An event set when the thread that follows a pass's count ends."""
    import threading

    from dfairpca.engine import _engine

    ended = threading.Event()
    follow = _engine._follow

    def following(*args):
        try:
            follow(*args)
        finally:
            ended.set()

    monkeypatch.setattr(_engine, "_follow", following)
    return ended


@pytest.mark.parametrize("given_up_after", [0.0, 1.5], ids=["before-the-count", "while-counting"])
def test_a_pass_given_up_on_is_not_kept_running_for_its_bar(client, monkeypatch, caplog,
                                                               given_up_after, followed):
    """A pass whose caller gives up (Ctrl-C, workers lost) is released, as without a bar:
    the bar's own reference to its key goes as soon as its count has found it (or at once
    if the count never started), and the count ends without an error of the scheduler."""
    import logging

    import dask

    from dfairpca.engine import _engine

    def give_up(client, futures, seconds):
        time.sleep(given_up_after)
        for f in futures:  # as gather_watched does, whatever happens
            f.release()
        raise KeyboardInterrupt

    key = f"a-long-pass-{given_up_after}"
    monkeypatch.setattr(_engine, "gather_watched", give_up)
    root = dask.delayed(time.sleep)(60, dask_key_name=key)
    with reporting(True, io.StringIO()), pytest.raises(KeyboardInterrupt):
        _engine._compute_with_progress(root)
    # the pass's key and the count may reach the scheduler after the caller gave up
    assert followed.wait(15), "the bar's thread still follows a pass given up on"

    def known(dask_scheduler):
        return key in dask_scheduler.tasks

    deadline, clean = time.monotonic() + 15, 0  # two clean looks in a row: the key's
    while clean < 2 and time.monotonic() < deadline:  # submission and release travel late
        gone = not client.run_on_scheduler(known) and not client.run_on_scheduler(feeds)
        clean = clean + 1 if gone else 0
        time.sleep(0.2)
    assert not client.run_on_scheduler(known), "the pass is kept running for its bar"
    assert client.run_on_scheduler(feeds) == 0
    assert not [r for r in caplog.records
                if r.name.startswith("distributed") and r.levelno >= logging.ERROR], caplog.text


def _refuse_unpickling():
    raise RuntimeError("this object cannot be unpickled")


class _Unpicklable:
    """An argument whose graph the scheduler cannot read (as with a client and a scheduler
    of different environments)."""

    def __reduce__(self):
        return _refuse_unpickling, ()


def test_a_pass_whose_graph_the_scheduler_refuses_leaves_no_count_behind(client, followed):
    """The scheduler never has the key of a graph it refused: the bar's count, which waits
    for the key, is not started, and the thread ends with the caller's error."""

    import dask

    from dfairpca.engine import _engine

    with reporting(True, io.StringIO()), pytest.raises(Exception, match="deserializ|unpickled"):
        _engine._compute_with_progress(dask.delayed(len)(_Unpicklable()))
    assert followed.wait(15), "the bar's thread still waits for a graph the scheduler refused"
    deadline = time.monotonic() + 10
    while client.run_on_scheduler(feeds) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.run_on_scheduler(feeds) == 0
