"""compute_dtype="auto" for 8-bit data: exact sums only where their kernel is not slower
than float32 products on the CPU at hand (dfairpca.stats._auto).

The kernels here are registered through the same registry as MKL's (withdrawn for the
test, so that every CPU sees only these): one slowed on purpose, one fast on purpose.  The
timing code's arithmetic is tested with a clock of its own, never against wall-clock values.
"""

import time

import numpy as np
import pytest

import dfairpca
from dfairpca.errors import InvalidInputError
from dfairpca.stats import _auto
from dfairpca.stats import _int_kernels as ik

WIDTH = 128


def int64_gram(x):
    xi = x.astype(np.int64)
    return np.asfortranarray(np.triu(xi.T @ xi))


def slow_gram(x):
    """Exact, and slowed on purpose: 50 ms of CPU a block (spent, not slept: "auto" counts
    the process's CPU time) on top of numpy's int64 product."""
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    return int64_gram(x)


class FastGram:
    """Exact, and fast on purpose where "auto" times it: the Gram of the block it saw last
    is remembered, so a probe's repeated rounds on one block cost an identity check."""

    def __init__(self):
        self.last = None
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        if self.last is not None and self.last[0] is x:
            return self.last[1]
        self.last = (x, int64_gram(x))
        return self.last[1]


@pytest.fixture
def registered(monkeypatch):
    """Register test kernels with the installed ones (MKL's) withdrawn; they come back after."""
    monkeypatch.delenv(_auto.AUTO_ENV, raising=False)
    ik._load_optional()
    installed = list(ik._REGISTERED)
    for k in installed:
        ik.unregister(k.name)
    names = []

    def register(name, fn):
        ik.register(ik.Kernel(name, fn, ("uint8", "int8")))
        names.append(name)

    yield register
    for name in names:
        ik.unregister(name)
    for k in installed:
        ik.register(k, first=False)


@pytest.fixture
def X():
    return np.random.default_rng(0).integers(0, 256, size=(300, WIDTH)).astype(np.uint8)


def test_a_kernel_slower_than_float32_leaves_auto_on_float32(registered, X):
    registered("test-slow", slow_gram)
    c = _auto.auto_choice("uint8", WIDTH)
    assert c.choice == "float32" and c.kernel == "test-slow" and c.ratio > 1
    assert c.rows == _auto.probe_rows(WIDTH) and c.width == WIDTH
    assert c.describe().startswith("float32 (auto: exact test-slow ") and "x slower" in c.describe()
    est = dfairpca.PCA(3).fit(X)
    assert est.statistics_kernel_ == "float32"
    assert dfairpca.PCA(3, compute_dtype="exact").fit(X).statistics_kernel_ == "exact:test-slow"
    # what show_versions prints
    report = dfairpca.show_versions(as_dict=True)["auto_choice"]
    assert [r["choice"] for r in report if r["kernel"] == "test-slow"] == ["float32"]


def test_a_kernel_faster_than_float32_makes_exact_the_default(registered, X):
    fast = FastGram()
    registered("test-fast", fast)
    c = _auto.auto_choice("uint8", WIDTH)
    assert c.choice == "exact" and c.kernel == "test-fast" and c.ratio < 1, c.describe()
    est = dfairpca.FairPCA(3).fit(X, sensitive_features=X[:, 0] > 127)
    assert est.statistics_kernel_ == "exact:test-fast"
    ref = dfairpca.FairPCA(3, compute_dtype="exact").fit(X, sensitive_features=X[:, 0] > 127)
    assert np.array_equal(est.components_, ref.components_)
    # measured once per process and width class: another fit of a near width asks no probe
    calls = fast.calls
    assert _auto.auto_choice("uint8", WIDTH + 1) is c
    assert fast.calls == calls


def test_the_choice_is_measured_again_once_the_registry_changes(registered):
    registered("test-fast", FastGram())
    assert _auto.auto_choice("uint8", WIDTH).choice == "exact"
    registered("test-slow", slow_gram)  # first in the registry now: the pass would use it
    assert _auto.auto_choice("uint8", WIDTH).choice == "float32"


def test_the_environment_forces_either_side_without_measuring(registered, monkeypatch, X):
    fast = FastGram()
    registered("test-fast", fast)
    ik.chosen("uint8")  # self-tested
    calls = fast.calls
    monkeypatch.setenv(_auto.AUTO_ENV, "float32")
    c = _auto.auto_choice("uint8", WIDTH)
    assert c.choice == "float32" and c.forced == "float32" and fast.calls == calls
    assert c.describe() == f"float32 ({_auto.AUTO_ENV}=float32)"
    assert dfairpca.PCA(3).fit(X).statistics_kernel_ == "float32"
    monkeypatch.setenv(_auto.AUTO_ENV, "exact")
    registered("test-slow", slow_gram)
    assert dfairpca.PCA(3).fit(X).statistics_kernel_ == "exact:test-slow"
    monkeypatch.setenv(_auto.AUTO_ENV, "fastest")
    with pytest.raises(InvalidInputError, match="'exact' or 'float32'"):
        dfairpca.PCA(3).fit(X)


def test_without_an_8bit_kernel_auto_keeps_float32_and_says_why(registered, X):
    c = _auto.auto_choice("uint8", WIDTH)
    assert c.choice == "float32" and c.kernel is None and "no 8-bit kernel" in c.describe()
    assert dfairpca.PCA(3).fit(X).statistics_kernel_ == "float32"


class Clock:
    """A clock that only the calls timed move."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_time_candidates_takes_the_best_of_alternating_rounds():
    clock, order = Clock(), []

    def cost(name, seconds):
        def call():
            order.append(name)
            clock.now += seconds.pop(0)
        return call

    best = _auto.time_candidates({"a": cost("a", [5.0, 1.0, 2.0]), "b": cost("b", [3.0, 4.0, 1.5])},
                                 repeats=3, seconds=100.0, clock=clock)
    assert best == {"a": 1.0, "b": 1.5}  # the first call's start-up is not the kernel's rate
    assert order == ["a", "b"] * 3


def test_time_candidates_stops_after_its_seconds_but_not_before_two_rounds():
    clock, calls = Clock(), []

    def call():
        calls.append(1)
        clock.now += 1.0

    _auto.time_candidates({"a": call, "b": call}, repeats=5, seconds=0.5, clock=clock)
    assert len(calls) == 4  # two rounds of two: the budget was spent in the first
    calls.clear()
    _auto.time_candidates({"a": call, "b": call}, repeats=5, seconds=5.0, clock=clock)
    assert len(calls) == 6  # a third round began at 4 s, none at 6 s


def test_decide_takes_exact_unless_it_is_slower_beyond_the_slack():
    assert _auto.decide(1.0, 1.0) == "exact"
    assert _auto.decide(1.0 * _auto.AUTO_SLACK, 1.0) == "exact"
    assert _auto.decide(1.01 * _auto.AUTO_SLACK, 1.0) == "float32"
    assert _auto.decide(0.3, 1.0) == "exact"


def test_probe_rows_are_bounded_multiples_of_64():
    lo, hi = _auto.PROBE_ROWS
    for d in (1, 64, 784, 3000, 6400, 100_000):
        r = _auto.probe_rows(d)
        assert lo <= r <= hi and r % 64 == 0
    assert _auto.probe_rows(1) == hi and _auto.probe_rows(6400) == lo


def test_a_cluster_is_exact_only_where_every_worker_chose_exact(client, monkeypatch):
    """Each worker measures (or is forced) on its own; one float32 worker makes the pass
    float32, and the choice names how many workers answered."""
    from dfairpca.engine._engine import auto_choice_for_pass

    monkeypatch.delenv(_auto.AUTO_ENV, raising=False)
    workers = sorted(client.scheduler_info()["workers"])
    env = f"import os; os.environ[{_auto.AUTO_ENV!r}] = "
    try:
        client.run(exec, env + "'exact'")
        c = auto_choice_for_pass(np.uint8, WIDTH)
        assert c.choice == "exact" and c.workers == len(workers) == 2
        client.run(exec, env + "'float32'", workers=workers[:1])
        c = auto_choice_for_pass(np.uint8, WIDTH)
        assert c.choice == "float32" and c.forced == "float32" and c.workers == 2
    finally:
        client.run(exec, f"import os; os.environ.pop({_auto.AUTO_ENV!r}, None)")


def test_statistics_dtype_decides_every_estimators_pass_dtype():
    """One function decides a pass's dtype: 'auto' takes the exact sums where the 8-bit
    choice says so, but never for weighted rows (their sums are not integer sums) nor
    where the estimator says not (numeric protected attributes: float64, their covariances
    are the constraint); matrix_free gives the float dtype, auto_float what 'auto' falls
    back to, resumed what a checkpoint's 'auto' chose."""
    from dfairpca.stats._auto import AutoChoice
    from dfairpca.stats._exact import EXACT, statistics_dtype

    asked = []

    def exact(x_dtype, width):
        asked.append(width)
        return AutoChoice(EXACT, width)

    def floats(x_dtype, width):
        return AutoChoice("float32", width)

    u8 = np.dtype(np.uint8)
    assert statistics_dtype(u8, "auto", 64, exact) == EXACT and asked == [64]
    assert statistics_dtype(u8, None, 64, floats) == np.float32
    assert statistics_dtype(u8, "auto", 64, floats, auto_float=np.float64) == np.float64
    assert statistics_dtype(u8, "auto", 64, exact, weighted=True) == np.float32
    assert statistics_dtype(u8, "auto", 64, exact, weighted=True, auto_float=np.float64) == np.float64
    assert statistics_dtype(u8, "auto", 64, exact, auto_float=np.float64, auto_exact=False) == np.float64
    assert statistics_dtype(u8, "auto", 64, exact, matrix_free=True) == np.float32
    assert statistics_dtype(u8, "exact", matrix_free=True) == np.float32
    assert statistics_dtype(u8, "float64", 64, exact, auto_float=np.float64, auto_exact=False) == np.float64
    assert statistics_dtype(u8, "auto", 64, exact, resumed="float32") == np.float32
    assert statistics_dtype(u8, "auto", 64, floats, resumed=EXACT) == EXACT
    assert statistics_dtype(np.dtype(np.int32), "auto", 64, exact) == np.float64
    assert statistics_dtype(u8, "float32", 64, exact, auto_float=np.float64) == np.float32
    assert asked == [64]  # only where 'auto' may choose the exact sums
    with pytest.raises(InvalidInputError, match="weighted rows are not integer sums"):
        statistics_dtype(u8, "exact", weighted=True)
    with pytest.raises(InvalidInputError, match="sums integer data exactly"):
        statistics_dtype(np.dtype(np.float32), "exact")
    # every "exact" answer holds the pass's n rows to int64 sums, before any work
    i16 = np.dtype(np.int16)
    assert statistics_dtype(i16, "exact", n=2 ** 31) == EXACT
    assert statistics_dtype(i16, "exact", n=float("nan")) == EXACT  # rows not known yet: the dtype alone
    with pytest.raises(InvalidInputError, match="cannot sum .* rows of int16 exactly"):
        statistics_dtype(i16, "exact", n=2 ** 33)
    with pytest.raises(InvalidInputError, match="cannot sum .* rows of int16 exactly"):
        statistics_dtype(i16, "auto", 64, floats, resumed=EXACT, n=2 ** 33)
    with pytest.raises(InvalidInputError, match="cannot sum .* rows of uint8 exactly"):
        statistics_dtype(u8, "auto", 64, exact, n=2 ** 50)
