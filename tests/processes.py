"""Processes the tests start: a command interrupted as Ctrl-C in a terminal does, and real
`dask scheduler` / `dask worker` processes (optionally each in its own mount namespace)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent


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


def dask_env():
    """Environment of the scheduler and worker processes: one BLAS thread each, and the
    test modules importable (a task may call a function of one)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    paths = (str(TESTS / "integration"), str(TESTS), env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def private_folder(folder) -> list[str]:
    """The prefix of a command that runs it in its own mount namespace with an empty tmpfs
    over ``folder``: what a worker on another machine sees of this one's folder (root and
    ``unshare`` needed, see :func:`can_unshare`)."""
    # the working directory again by name: one inside ``folder`` is then the tmpfs (or gone:
    # /), not the hidden folder that the process would still hold open
    return ["unshare", "--mount", "--", "sh", "-c",
            'mount -t tmpfs dfairpca-test "$0" && { cd "$PWD" 2>/dev/null || cd /; } && exec "$@"',
            str(folder)]


def can_unshare() -> str | None:
    """None if :func:`private_folder` works here, else why not (for a skip)."""
    try:
        done = subprocess.run(["unshare", "--mount", "--", "sh", "-c", "mount -t tmpfs none /mnt"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare cannot run: {exc}"
    if done.returncode:
        return (f"a worker needs its own mount namespace (root and unshare): "
                f"`unshare --mount` + `mount -t tmpfs` failed: {done.stderr.strip()}")
    return None


class DaskProcesses:
    """A `dask scheduler` process and `dask worker` processes, stopped and reaped on exit;
    ``prefixes``: one command prefix per worker (a network or mount namespace),
    ``scheduler_prefix`` the scheduler's; ``env``: variables set in every process's
    environment (Dask configuration), or removed where None.  Workers that cannot read the scheduler file (in a
    mount namespace that hides it) are given its address instead: ``by_address``."""

    def __init__(self, tmp_path, host="127.0.0.1", worker_hosts=("127.0.0.1",) * 2, prefixes=None,
                 extra_args=(), worker_args=(), scheduler_prefix=(), env=None, by_address=False):
        self.dir = tmp_path
        self.scheduler_file = tmp_path / "scheduler.json"
        self.host, self.worker_hosts = host, list(worker_hosts)
        self.prefixes = prefixes or [[] for _ in self.worker_hosts]
        self.scheduler_prefix = list(scheduler_prefix)
        self.env = dict(env or {})
        self.by_address = by_address
        self.extra_args = list(extra_args)  # for the scheduler and every worker (TLS)
        self.worker_args = list(worker_args)  # for every worker only
        self.scheduler, self.workers = None, []

    def _spawn(self, args, log, prefix=()):
        out = open(self.dir / log, "w")
        try:
            return subprocess.Popen([*prefix, sys.executable, "-m", *args, *self.extra_args],
                                    stdout=out, stderr=subprocess.STDOUT,
                                    env={k: v for k, v in {**dask_env(), **self.env}.items()
                                         if v is not None}, cwd=self.dir)
        finally:
            out.close()

    def __enter__(self):
        try:
            self.scheduler = self._spawn(
                ["distributed.cli.dask_scheduler", "--host", self.host, "--port", "0",
                 "--scheduler-file", str(self.scheduler_file), "--no-dashboard"],
                "scheduler.log", self.scheduler_prefix)
            for host, prefix in zip(self.worker_hosts, self.prefixes):
                self.add_worker(host, prefix)
        except BaseException:
            self.__exit__()
            raise
        return self

    def address(self, timeout: float = 60) -> str:
        """The address the scheduler wrote to its scheduler file (waiting for it)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return json.loads(self.scheduler_file.read_text())["address"]
            except (OSError, ValueError, KeyError):
                assert time.monotonic() < deadline and self.scheduler.poll() is None, self.logs()
                time.sleep(0.1)

    def add_worker(self, host="127.0.0.1", prefix=(), nanny=False, memory_limit="2GiB"):
        """Start one more `dask worker` process (one thread; without a nanny SIGKILL ends
        it, with one the nanny starts a new worker process, at a new address, in its place,
        also when the worker goes past 95% of ``memory_limit``)."""
        i = len(self.workers)
        where = [self.address()] if self.by_address else ["--scheduler-file", str(self.scheduler_file)]
        self.workers.append(self._spawn(
            ["distributed.cli.dask_worker", *where,
             "--nworkers", "1", "--nthreads", "1", "--memory-limit", memory_limit,
             "--nanny" if nanny else "--no-nanny", "--no-dashboard", "--host", host,
             "--local-directory", str(self.dir / f"w{i}"), *self.worker_args],
            f"worker{i}.log", prefix))

    def __exit__(self, *exc):
        # workers first, so that none waits on a scheduler that is already gone
        stop(self.workers)
        stop([self.scheduler] if self.scheduler is not None else [])

    def logs(self) -> str:
        logs = sorted(self.dir.glob("*.log"))
        return "\n".join(f"--- {f.name}\n{f.read_text()[-3000:]}" for f in logs)


def stop(procs):
    """SIGTERM, then SIGKILL after 10 s; always reaped."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
