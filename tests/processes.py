"""Ctrl-C for a command run as a terminal runs a job: what the interrupt tests share."""

import os
import signal
import subprocess


def interrupted(cmd, ready, *, timeout: float, **popen) -> tuple[int, str, str]:
    """``(returncode, stdout, stderr)`` of ``cmd`` interrupted as Ctrl-C in a terminal does.

    ``cmd`` runs in its own process group (as a terminal runs a job); ``ready(proc)``
    returns at the moment under test (it may read stdout or assert); then the whole group
    gets SIGINT and ``cmd`` must exit within ``timeout`` seconds.  The group is killed if
    anything fails on the way, so no process outlives the test.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **popen)
    try:
        ready(proc)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out, err
