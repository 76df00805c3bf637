"""GC pacing: collections only in slack, full collections only where they fit."""

import gc

from replayer.run.gcpacer import GcPacer


def _generations(pacer: GcPacer, calls) -> list[int]:
    seen: list[int] = []

    def cb(phase, info):
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(cb)
    try:
        for slack_ns in calls:
            pacer._last -= 10  # as if the interval had passed
            pacer.idle(slack_ns)
    finally:
        gc.callbacks.remove(cb)
    return seen


def test_a_full_collection_waits_for_slack_that_fits_it_and_young_ones_are_forced():
    pacer = GcPacer(min_slack_ns=1_000_000, interval_s=0.0, max_interval_s=1e9, full_every=2)
    pacer.start()
    try:
        pacer._cost_ns[2] = 50_000_000  # a full collection took 50 ms last time
        assert _generations(pacer, [10_000_000]) == [1]  # young generations: 10 ms is enough
        assert _generations(pacer, [10_000_000]) == []  # the full one is due: 10 ms is too little
        assert _generations(pacer, [200_000_000]) == [2]  # it runs when 100 ms of slack comes
        pacer.max_interval_s = 5.0
        pacer._since_full = 1
        assert _generations(pacer, [0]) == [1]  # overdue: the cheap one is forced
    finally:
        pacer.stop()


def test_a_full_collection_is_forced_when_no_slack_ever_comes():
    pacer = GcPacer(min_slack_ns=1_000_000, interval_s=0.0, max_interval_s=0.0, full_every=3)
    pacer.start()
    try:
        pacer._cost_ns[2] = 10**12  # never fits
        gens = _generations(pacer, [0] * 12)
    finally:
        pacer.stop()
    assert 2 in gens and gens.index(2) == 2 * 3  # deferred full_every more times, then forced
