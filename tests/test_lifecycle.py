"""The run's start-up order as data (replayer.run.startup), checked with no network: the
steps run in START_UP's order, the order keeps slow work before the pool and the anchor last,
and the start-up gives exactly those steps."""

from __future__ import annotations

import ast
import asyncio
import contextlib
from pathlib import Path

import pytest

from replayer.run import START_UP
from replayer.run.startup import STEP_NAMES, start_up


def test_the_start_up_order_keeps_the_slow_work_ahead_of_the_pool_and_the_anchor_last():
    order = list(STEP_NAMES)
    # the trace's first batch feeds the warm-up and the prebuild; the images, prompt texts and
    # the first lead window are made before the pool opens (a server closes idle keep-alive
    # connections), and the anchor comes last: none of it is charged to the first requests
    assert order.index("first batch") < order.index("warm-up") < order.index("prebuild")
    assert order.index("tracing") < order.index("anchor")  # the SDK's import is start-up, not the first requests' lag
    assert order.index("prebuild") < order.index("pool") < order.index("anchor") == len(order) - 1
    # the target's baseline scrape: before the anchor (no request of the run sent yet) and before
    # the pool opens (a slow /metrics leaves no pooled connection idle)
    assert order.index("target baseline") < order.index("pool")
    assert all(why for _, why in START_UP)


def test_start_up_runs_the_steps_in_order_and_stops_at_a_failing_one():
    ran: list[str] = []

    def step(name: str, fail: bool = False):
        async def run() -> None:
            ran.append(name)
            if fail:
                raise RuntimeError(name)

        return run

    steps = {name: step(name) for name in reversed(STEP_NAMES)}  # (given in another order)
    asyncio.run(start_up(steps))
    assert ran == list(STEP_NAMES)
    ran.clear()
    steps["prebuild"] = step("prebuild", fail=True)
    with pytest.raises(RuntimeError, match="prebuild"):
        asyncio.run(start_up(steps))
    assert ran == ["first batch", "warm-up", "prebuild"]  # no pool opened, no anchor taken


def test_start_up_refuses_a_missing_or_an_unknown_step():
    async def nothing() -> None:
        pass

    with pytest.raises(ValueError, match="missing"):
        asyncio.run(start_up({name: nothing for name in STEP_NAMES[:-1]}))
    with pytest.raises(ValueError, match="unknown"):
        asyncio.run(start_up({**{name: nothing for name in STEP_NAMES}, "extra": nothing}))


def test_parts_closed_in_reverse_when_a_start_up_step_fails():
    # the run's teardown is an AsyncExitStack each part registers on as it is built
    closed: list[str] = []

    async def run() -> None:
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(closed.append, "gc pacer")
            stack.callback(closed.append, "launcher")

            async def pool() -> None:
                stack.callback(closed.append, "pools")
                raise OSError("connect refused")

            async def nothing() -> None:
                pass

            await start_up({**{n: nothing for n in STEP_NAMES}, "pool": pool})

    with pytest.raises(OSError):
        asyncio.run(run())
    assert closed == ["pools", "launcher", "gc pacer"]


def test_the_run_gives_start_up_exactly_the_steps_of_start_up():
    # read from the code: the dict of steps StartUp passes to start_up names START_UP's steps
    tree = ast.parse((Path(__file__).resolve().parents[1] / "replayer" / "run" / "startup.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "start_up"]
    assert len(calls) == 1 and isinstance(calls[0].args[0], ast.Dict)
    assert {k.value for k in calls[0].args[0].keys} == set(STEP_NAMES)
