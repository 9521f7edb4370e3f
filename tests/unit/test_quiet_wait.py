"""The Horovod engine's wait (engine/quiet_wait.py), on a simulated clock: it spins only for the
first millisecond, then sleeps 50 µs, 100 µs, ... capped at 2 ms; it returns once every started
handle is done and never waits for one that was not started."""

from __future__ import annotations

from hpctrain.engine.quiet_wait import MAX_SLEEP_S, SPIN_S, optimizer_handles, wait_quietly


class Clock:
    def __init__(self) -> None:
        self.now, self.sleeps = 0.0, list[float]()

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def test_a_collective_done_within_the_spin_costs_no_sleep() -> None:
    clock, polls = Clock(), iter([False, False, True])
    assert wait_quietly(["h"], lambda h: next(polls), clock, clock.sleep) == 0
    assert clock.sleeps == []


def test_a_long_wait_sleeps_doubling_to_the_cap_and_ends_when_the_last_handle_is_done() -> None:
    clock = Clock()
    done_at = {"a": 0.004, "b": 0.030}  # seconds after the start on the simulated clock

    def poll(h: str) -> bool:
        if clock.now < SPIN_S:
            clock.now += SPIN_S / 2  # each spin round takes half the spin time here
        return clock.now >= done_at[h]

    sleeps = wait_quietly(["a", None, "b"], poll, clock, clock.sleep)
    assert clock.sleeps[:6] == [5e-5, 1e-4, 2e-4, 4e-4, 8e-4, 1.6e-3]
    assert set(clock.sleeps[6:]) == {MAX_SLEEP_S} and sleeps == len(clock.sleeps)
    # it returns at the first look after b is done: at most one capped sleep late
    assert done_at["b"] <= clock.now < done_at["b"] + MAX_SLEEP_S


def test_nothing_started_nothing_waited() -> None:
    clock = Clock()
    assert wait_quietly([None, None], lambda h: False, clock, clock.sleep) == 0


def test_the_optimizer_handles_are_read_whatever_their_keys() -> None:
    class Optimizer:  # Horovod's DistributedOptimizer keeps (handle, context) per parameter or group
        _handles = {"p1": (7, None), ("p2", "p3"): (8, "ctx"), "p4": (None, None)}

    assert optimizer_handles(Optimizer()) == [7, 8, None]
    assert optimizer_handles(object()) == []
