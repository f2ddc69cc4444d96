"""dfairpca.cluster.check_workers_see without a cluster: what it concludes from each
worker's answer, and how it says so (tests/integration/test_unshared_storage.py runs it
against a real worker in its own mount namespace)."""

import pytest

from dfairpca.cluster import NotShared, check_workers_see


class Workers:
    """A stand-in for a Client whose ``run`` asks each worker here, seeing every path
    through ``seen_as[address]`` (another root, where that worker's machine has its own
    files), or failing as a worker without dfairpca's probe does (``broken``)."""

    def __init__(self, seen_as: dict, broken=()):
        self.seen_as, self.broken, self.asked = seen_as, list(broken), 0

    def run(self, func, *args, on_error="raise"):
        assert on_error == "return"
        self.asked += 1
        answers = {}
        for address, moved in self.seen_as.items():
            answers[address] = func(*(moved(a) if isinstance(a, str) and a.startswith("/") else a
                                      for a in args))
        for address in self.broken:
            answers[address] = AttributeError("Can't get attribute '_sees_file'")
        return answers


def same(path):
    return path


def elsewhere(root):
    return lambda path: str(root) + path


def test_an_input_names_the_workers_that_do_not_find_it_or_find_another_file(tmp_path):
    data = tmp_path / "d.zarr" / "zarr.json"
    data.parent.mkdir()
    data.write_text("{}")
    other = tmp_path / "other"
    (other / str(data.parent).lstrip("/")).mkdir(parents=True)
    (other / str(data).lstrip("/")).write_text('{"another": 1}')
    seen_as = {"tcp://a:1": same, "tcp://b:1": same, "tcp://o:1": elsewhere(other),
               **{f"tcp://x{i}:1": elsewhere(tmp_path / "nothing") for i in range(6)}}
    with pytest.raises(NotShared) as info:
        check_workers_see(Workers(seen_as), data, "the Zarr array", shown=data.parent)
    message = str(info.value)
    assert message.startswith(f"7 of the 9 Dask workers cannot read the Zarr array '{data.parent}' "
                              "at that path"), message
    assert "tcp://o:1 (another file is there)" in message and "tcp://x0:1 (not there)" in message
    assert "and 2 more; put it on a file system that every worker mounts at the same path" in message
    assert "tcp://a:1" not in message and "tcp://b:1" not in message and "\n" not in message
    check_workers_see(Workers({"tcp://a:1": same, "tcp://b:1": same}), data, "the Zarr array")


def test_an_output_folder_is_checked_with_a_token_that_leaves_nothing_behind(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    check_workers_see(Workers({"tcp://a:1": same}), out, "the output store", output=True)
    with pytest.raises(NotShared, match=r"^the Dask worker cannot write the output store 'OUT' at "
                                        r"that path, .*: tcp://b:1 \(not there\); put it on"):
        check_workers_see(Workers({"tcp://b:1": elsewhere(tmp_path / "nothing")}), out,
                          "the output store", output=True, shown="OUT")
    assert list(out.iterdir()) == []


def test_a_worker_that_cannot_run_the_question_is_not_taken_for_one_that_cannot_see(tmp_path):
    with pytest.raises(ConnectionError, match=r"cannot ask the Dask worker tcp://c:1 whether it sees "
                                              r".*AttributeError.*same dfairpca, dask and distributed"):
        check_workers_see(Workers({"tcp://a:1": same}, broken=["tcp://c:1"]), tmp_path, "x", output=True)


def test_urls_and_no_client_ask_nothing(tmp_path):
    workers = Workers({"tcp://a:1": elsewhere(tmp_path / "nothing")})
    check_workers_see(workers, "s3://bucket/d.zarr/zarr.json", "the Zarr array")
    check_workers_see(None, tmp_path / "absent", "the Zarr array")
    assert workers.asked == 0
