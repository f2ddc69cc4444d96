"""The 8-bit Gram kernels on every CPU: MKL's binding checked on values where its int8 GEMM
is exact on any x86 CPU (no pair of products leaves 16 bits), one kernel per process
however many threads ask at once, a refusal said once, and the machine report."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dfairpca
from dfairpca.stats import _int_kernels as ik
from dfairpca.stats import _mkl

FN = _mkl._library()
needs_mkl = pytest.mark.skipif(FN is None, reason="MKL is not installed (pip install 'dfairpca[mkl]'; "
                                                    "x86-64 only): its binding cannot be called here")


def int64_gram(x):
    xi = x.astype(np.int64)
    return np.asfortranarray(np.triu(xi.T @ xi))


def narrow(dtype, shape, seed=0):
    """Values whose shifted operands stay in [-28, 28] against [100, 156]: a pair of
    products is at most 2 * 156 * 28 = 8,736, so even a CPU that sums pairs in saturating
    16-bit registers (no VNNI) computes MKL's int8 GEMM exactly."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.uint8:
        return rng.integers(100, 156, size=shape, endpoint=True).astype(np.uint8)
    return rng.integers(-28, 28, size=shape, endpoint=True).astype(np.int8)


@needs_mkl
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("shape", [(1, 1), (9, 3), (700, 513), (300, 1100), (0, 4)])
def test_mkl_binding_is_exact_on_narrow_values_on_any_cpu(dtype, shape):
    """Offsets, transposes, panels beyond the diagonal and the column-sum correction: a
    wrong enum (CblasRowOffset for CblasFixOffset) or a wrong pointer fails here even on a
    CPU whose self-test refuses the kernel for wide values."""
    x = narrow(dtype, shape)
    got = _mkl.mkl_gram(FN, x)
    assert got.dtype == np.int64 and got.flags.f_contiguous
    assert np.array_equal(got, int64_gram(x))


@needs_mkl
def test_mkl_binding_sums_several_calls_exactly(monkeypatch):
    """Rows beyond one call's int32 range are summed over calls in int64 (a small call
    size stands in for 65,000 rows)."""
    monkeypatch.setattr(_mkl, "ROWS_PER_CALL", 64)
    for dtype in ("uint8", "int8"):
        x = narrow(dtype, (1000, 37), seed=1)
        assert np.array_equal(_mkl.mkl_gram(FN, x), int64_gram(x))


@needs_mkl
def test_the_offsets_are_mkls_enums():
    # MKL's CBLAS_OFFSET: CblasRowOffset (one per column of C), CblasColOffset (one per
    # row), CblasFixOffset (one for all); 171 passed for "fixed" read past its array
    assert (_mkl._ROW_OFFSET, _mkl._COL_OFFSET, _mkl._FIX_OFFSET) == (171, 172, 173)


@needs_mkl
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_mkl_adds_into_a_total_beyond_int32_through_its_scratch(dtype, monkeypatch):
    """``mkl_add`` adds each call's int32 products into an int64 total already beyond 2**32,
    through one scratch array over calls, several calls per block (a small call size
    stands in for 32,768 rows) and blocks of another shape (a new scratch)."""
    monkeypatch.setattr(_mkl, "ROWS_PER_CALL", 100)
    d = 530  # two panels: the offsets of the second start at its first row or column
    start = np.triu(np.full((d, d), 3 * 2 ** 40, np.int64))
    G = start.copy(order="F")
    x, y = narrow(dtype, (250, d), seed=3), narrow(dtype, (60, d), seed=4)
    scratch = _mkl.mkl_add(FN, G, x)
    assert scratch.buf.dtype == np.int32 and scratch.buf.shape == (d, d) and scratch.rows == 0
    assert _mkl.mkl_add(FN, G, y, scratch) is scratch
    assert np.array_equal(G, start + int64_gram(x) + int64_gram(y))
    small = G[:7, :7].copy(order="F")
    assert _mkl.mkl_add(FN, small, x[:, :7], scratch) is not scratch
    assert _mkl.mkl_add(FN, G, x[:0], scratch) is scratch


@needs_mkl
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_mkl_keeps_products_pending_in_int32_until_full_or_flushed(dtype, monkeypatch):
    """With ``keep`` the products of up to ROWS_PER_CALL rows stay in the int32 sums (a
    small call size stands in for 32,768 rows): G gets them when those sums would
    overflow, when another total's rows come, or at the flush; then G is exact."""
    monkeypatch.setattr(_mkl, "ROWS_PER_CALL", 100)
    d = 530
    start = np.triu(np.full((d, d), 5 * 2 ** 40, np.int64))
    G, H = start.copy(order="F"), start.copy(order="F")
    x = narrow(dtype, (330, d), seed=5)
    p = _mkl.mkl_add(FN, G, x[:40], keep=True)
    assert p.rows == 40 and np.array_equal(G, start)  # pending
    _mkl.mkl_add(FN, G, x[40:90], p, keep=True)
    assert p.rows == 90 and np.array_equal(G, start)
    _mkl.mkl_add(FN, G, x[90:150], p, keep=True)  # 150 > 100: the 90 go into G first
    assert p.rows == 60 and np.array_equal(G, start + int64_gram(x[:90]))
    _mkl.mkl_add(FN, G, x[150:330], p, keep=True)  # a block over one call: 100 + 80
    assert p.rows == 80
    _mkl.mkl_add(FN, H, x[:10], p, keep=True)  # another total: G's pending rows into G
    assert p.target is H and np.array_equal(G, start + int64_gram(x))
    p.flush()
    assert p.rows == 0 and np.array_equal(H, start + int64_gram(x[:10]))
    p.flush()  # nothing pending: nothing added twice
    assert np.array_equal(H, start + int64_gram(x[:10]))


@needs_mkl
def test_a_flush_from_another_thread_waits_for_the_add_in_progress():
    """A distributed worker may pickle a running total (to spill it) while the next chunk
    is added on another thread: the flush that pickling does waits for the add, so no
    rows are added twice or lost."""
    import threading
    import time

    def slow(*args):  # MKL's call, then a pause: a flush would land mid-add
        FN(*args)
        time.sleep(0.01)

    d = 530
    x = narrow("uint8", (300, d), seed=7)
    G = np.zeros((d, d), np.int64, order="F")
    p = _mkl.mkl_add(FN, G, x[:100], keep=True)
    adding = threading.Thread(target=lambda: _mkl.mkl_add(slow, G, x[100:], p, keep=True))
    adding.start()
    while adding.is_alive():
        p.flush()
        time.sleep(0.001)
    adding.join()
    p.flush()
    assert np.array_equal(G, int64_gram(x))


def test_a_kernel_whose_additions_wrap_is_refused():
    """The self-test adds into a total beyond 2**32: an ``add`` that sums in 32 bits is
    refused (its Gram alone is right)."""
    def gram(x):
        return int64_gram(x)

    def add32(G, x, scratch=None, keep=False):
        G[...] = (G + int64_gram(x)).astype(np.int32)
        return scratch

    assert ik.self_test(gram, "uint8")
    assert not ik.self_test(gram, "uint8", add32)
    assert ik.self_test(gram, "uint8", ik.Kernel("int64", gram, ("uint8",)).adder())

    class Forgetful:  # keeps products pending and loses them at the flush
        def flush(self):
            pass

    def add_pending(G, x, scratch=None, keep=False):
        if not keep:
            ik._add_upper(G, int64_gram(x))
        return Forgetful()

    assert not ik.self_test(gram, "uint8", add_pending)

    def through_float32(x):  # right while the sums stay below 2**24, as small blocks do
        return np.asfortranarray(int64_gram(x).astype(np.float32).astype(np.int64))

    assert not ik.self_test(through_float32, "uint8")

    def pending_float32(G, x, scratch=None, keep=False):
        """Adds blocks of 16,384 rows, each block's products held as float32 when pending."""
        for s in range(0, len(x), 16_384):
            g = int64_gram(x[s:s + 16_384])
            ik._add_upper(G, g.astype(np.float32).astype(np.int64) if keep else g)
        return scratch

    for dtype in ("uint8", "int8"):
        assert not ik.self_test(gram, dtype, pending_float32)


def test_where_the_cpu_has_an_int8_unit_mkls_kernel_passes_its_self_test():
    """On a CPU with VNNI or AMX and MKL installed, the self-test must accept MKL's kernel
    (a binding or self-test that refuses a right kernel leaves exact statistics slow, and
    nothing else would say so); elsewhere its verdict is whatever the CPU gives."""
    from dfairpca.base._system import cpu_info

    report = ik.kernel_report()
    if FN is None:
        assert _mkl.NAME not in report
    elif any(cpu_info()["int8_flags"].values()):
        assert report[_mkl.NAME] is True
        assert ik.kernel_for("uint8")[0] == ik.kernel_for("int8")[0] == _mkl.NAME
    else:
        assert report[_mkl.NAME] in (True, False)


@needs_mkl
def test_with_avx2_only_mkl_the_statistics_stay_exact(tmp_path):
    """MKL limited to AVX2 (no VNNI: its int8 GEMM saturates) in a fresh process: the
    self-test decides, and whichever kernel forms them the statistics are the integers."""
    code = textwrap.dedent("""
        import json, numpy as np, dfairpca
        rng = np.random.default_rng(2)
        X = rng.integers(0, 256, size=(600, 9)).astype(np.uint8)
        X[:, 0] = 255; X[::2, 1] = 255; X[1::2, 1] = 0
        m = dfairpca.compute_moments(X, dtype="exact")
        Xi = X.astype(np.int64)
        S = Xi.T @ Xi - np.outer(Xi.sum(0), Xi.sum(0)) / len(X)
        print(json.dumps({"kernels": list(m.exact.kernels),
                          "err": float(np.abs(m.scatter - S).max() / np.abs(S).max())}))
    """)
    env = dict(os.environ, MKL_ENABLE_INSTRUCTIONS="AVX2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True, cwd=tmp_path)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["err"] < 1e-15
    assert len(r["kernels"]) == 1


RACE = textwrap.dedent("""
    import json, threading, time, numpy as np
    from dfairpca.stats import _int_kernels as ik, _mkl

    def slow_kernel():
        time.sleep(0.5)  # as long as loading MKL can take: threads arrive meanwhile
        def gram(x):
            xi = x.astype(np.int64)
            return np.asfortranarray(np.triu(xi.T @ xi))
        return "slow-int64", gram, ("uint8", "int8")

    _mkl.mkl_kernel = slow_kernel
    x = np.random.default_rng(0).integers(0, 256, size=(50, 6)).astype(np.uint8)
    start, names = threading.Barrier(8), []
    def work():
        start.wait()
        names.append(ik.gram(x)[1])
    threads = [threading.Thread(target=work) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(json.dumps(sorted(set(names))))
""")


def test_threads_of_a_fresh_process_all_use_the_kernel_chosen_first(tmp_path):
    """Eight threads asking for a kernel at once while the optional kernel still loads: all
    get it (none falls back to the portable kernel because the registry looked loaded)."""
    out = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=120,
                         check=True, cwd=tmp_path)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["slow-int64"]


def test_a_refused_optional_kernel_is_said_once_and_reported(monkeypatch, caplog):
    def wrong_gram(x):  # as a VNNI-less CPU's saturating sums would be, on the self-test's data
        return int64_gram(x) + 1

    ik._load_optional()
    installed = list(ik._REGISTERED)
    for k in installed:
        ik.unregister(k.name)
    monkeypatch.setattr(_mkl, "mkl_kernel", lambda: ("fake-vnni-less", wrong_gram, ("uint8",)))
    monkeypatch.setattr(ik, "_OPTIONAL_LOADED", False)
    try:
        with caplog.at_level("INFO", logger="dfairpca"):
            ik._load_optional()
            ik._load_optional()
            x = np.random.default_rng(0).integers(0, 256, size=(40, 5)).astype(np.uint8)
            assert ik.gram(x)[1] == ik.PORTABLE
        said = [r for r in caplog.records if "fake-vnni-less failed its self-test" in r.getMessage()]
        assert len(said) == 1
        assert ik.kernel_report()["fake-vnni-less"] is False
        assert ik.int8_kernel_available() is None
    finally:
        ik.unregister("fake-vnni-less")
        for k in installed:
            ik.register(k, first=False)


def test_show_versions_names_the_machine_and_the_kernels(capsys):
    dfairpca.show_versions()
    text = capsys.readouterr().out
    for section in ("dependencies", "threadpools (BLAS, OpenMP)", "cpu", "exact kernels",
                    'compute_dtype="auto" for 8-bit data'):
        assert section in text
    r = dfairpca._show_versions.versions_report()
    assert r["dfairpca"] == dfairpca.__version__ and r["packages"]["numpy"] == np.__version__
    assert set(r["cpu"]["int8_flags"]) == {"amx_int8", "avx512_vnni", "avx_vnni"}
    for name, verdict in r["exact_kernels"].items():
        assert f"{name}: " in text and verdict in (True, False, None)
    if FN is not None:
        assert "mkl-gemm-s8u8s32" in r["exact_kernels"]
    # what "auto" chose here, and why (measured at 1,024 columns if no fit asked before)
    assert r["auto_choice"] and all(c["choice"] in ("exact", "float32") for c in r["auto_choice"])
    for c in r["auto_choice"]:
        assert c["description"] in text and c["description"].startswith(c["choice"])


def test_dfairpca_info_prints_the_report_as_json(capsys):
    from dfairpca.cli import main

    assert main(["info", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["dfairpca"] == dfairpca.__version__ and "exact_kernels" in r


def test_a_kernel_is_self_tested_for_each_dtype_it_serves():
    """Its uint8 and int8 paths differ (which operand is flipped): a kernel right for one
    and wrong for the other is used for the first only."""
    def half_right(x):
        g = int64_gram(x)
        return g if x.dtype == np.uint8 else g + 1

    ik._load_optional()
    installed = list(ik._REGISTERED)
    for k in installed:
        ik.unregister(k.name)
    try:
        ik.register(ik.Kernel("half-right", half_right, ("uint8", "int8")))
        assert ik.kernel_for("uint8")[0] == "half-right"
        assert ik.kernel_for("int8")[0] == ik.PORTABLE
        assert ik.kernel_report()["half-right"] is False
    finally:
        ik.unregister("half-right")
        for k in installed:
            ik.register(k, first=False)
