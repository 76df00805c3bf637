"""A replay in this process against an aiohttp app served on 127.0.0.1 (tests only)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from replayer.config import load_config
from replayer.run import run_replay


def replay_against(
    app: web.Application, trace: Path, results: Path, *, registry: CollectorRegistry | None = None, **settings: Any
) -> dict:
    """Serve ``app`` on a free port, replay ``trace`` against it (``run_replay``, results in
    ``results``, the model ``m``, no admin port, no scrape, 2 connections warmed, plus
    ``settings``) and return the summary; the server is stopped whatever happens."""

    async def main() -> dict:
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        try:
            cfg = load_config(
                {
                    "trace": str(trace),
                    "target": f"http://127.0.0.1:{port}",
                    "model": "m",
                    "results": str(results),
                    "admin_port": 0,
                    "quiet": True,
                    "scrape_target_metrics": False,
                    "warm_connections": 2,
                    **settings,
                }
            )
            return await asyncio.wait_for(run_replay(cfg, registry=registry or CollectorRegistry()), 120)
        finally:
            await runner.cleanup()

    return asyncio.run(main())
