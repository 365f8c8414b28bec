"""Helper process for test_prometheus_live.py (not a test module): the
watchdog scenario of test_watchdog_sim.py -- `cachepilot run`'s own wiring,
a real controller behind loopback gRPC and a sim node whose tenant is
switched to a policy that then misses far more than its curve promised --
paced at PACE wall seconds an interval, with the controller's metrics on
127.0.0.1:PORT, so that a real Prometheus scrapes the counter before and
after the revert.  After its first interval it waits until the file GO
exists: the test creates it once Prometheus holds the counter at 0, since
a counter first scraped after the revert has no increase to alert on.
Serves on until terminated.

usage: watchdog_revert_run.py PORT PACE GO"""
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from test_watchdog_sim import INTERVALS, LyingSim, config  # noqa: E402

from cachepilot import run as run_mod  # noqa: E402


def main() -> int:
    port, pace, go = int(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3])
    cfg = config()
    cfg.controller.metrics_port = port
    run_mod.SimBackend = LyingSim

    def on_interval(*_):
        while not go.exists():
            time.sleep(0.2)
        time.sleep(pace)
    _, log, _ = run_mod.run_autopilot(cfg, INTERVALS, on_interval=on_interval)
    reverts = sum(e.kind == "watchdog" for e in log)
    print(f"done: {INTERVALS} intervals, {reverts} watchdog revert(s)", flush=True)
    threading.Event().wait()      # keep /metrics up for Prometheus
    return 0


if __name__ == "__main__":
    sys.exit(main())
