"""What a real scheduler is running, asked with ``client.run_on_scheduler``."""


def feeds(dask_scheduler) -> int:
    """How many of the scheduler's coroutines are in its progress handler, ``feed`` (a
    progress bar's count of a computation; one waiting for a key nobody will submit polls
    until the scheduler closes)."""
    import asyncio

    def in_feed(coro) -> bool:
        while coro is not None:
            if getattr(getattr(coro, "cr_code", None), "co_name", None) == "feed":
                return True
            coro = getattr(coro, "cr_await", None)
        return False

    return sum(in_feed(t.get_coro()) for t in asyncio.all_tasks())
