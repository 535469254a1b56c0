"""Waiting for a worker's events in tests."""

import time


def until(client, kinds, timeout=180):
    """The first event of `kinds` and every event seen up to it; fails naming what came."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = client.wait_event(1.0)
        if event is None:
            if not client.is_alive():
                break
            continue
        seen.append(event)
        if isinstance(event, kinds):
            return event, seen
    raise AssertionError(f"no {kinds} within {timeout}s; saw {[type(e).__name__ for e in seen]}")
