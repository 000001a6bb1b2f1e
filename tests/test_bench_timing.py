"""benchmarks/suite/timing.py's user-call timing without a GPU: a case's calls take turns sample by sample, each
under its own context, each as many samples as its own time allows, and a failing call is reported and left out
while the others go on."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from suite.timing import QUICK, USER_CALL_METHOD, UserCall, time_user_calls, time_user_calls_in_turn, turn_order


class RecordingDevice:
    """The device protocol on a log: every timed sample is a ("sample", name) entry, and takes `ms`."""

    def __init__(self, log: list[tuple[str, str]], ms: float) -> None:
        self.log, self.ms = log, ms

    def synchronize(self) -> None:
        pass

    def wait(self, result) -> None:
        pass

    def start_timer(self) -> None:
        return None

    def stop_timer(self, timer, last_result) -> float:
        self.log.append(("sample", last_result))
        return self.ms


def user_call(log: list[tuple[str, str]], name: str, ms: float = 1.0, fails_at: int | None = None) -> UserCall:
    calls = iter(range(10**6))

    def call() -> str:
        if next(calls) == fails_at:
            raise RuntimeError(f"{name} broke")
        return name

    @contextlib.contextmanager
    def active():
        log.append(("enter", name))
        yield {}

    return UserCall(name, RecordingDevice(log, ms), call, active)


def test_the_calls_take_turns_sample_by_sample_each_under_its_context() -> None:
    log: list[tuple[str, str]] = []
    timed = time_user_calls_in_turn([user_call(log, "a"), user_call(log, "b")], QUICK, lambda: None,
                                    lambda key, error: pytest.fail(f"{key}: {error}"))
    samples = [name for kind, name in log if kind == "sample"]
    rounds = QUICK.max_reps  # a 1 µs warm-up asks for the most samples
    assert samples == [name for turn in range(rounds) for name in turn_order(["a", "b"], turn)]
    entered = [name for kind, name in log if kind == "enter"]
    assert entered == ["a", "b"] + samples  # the warm-ups, then one entry per sample
    assert timed == {name: {"median_ms": 1.0, "min_ms": 1.0, "p90_ms": 1.0, "samples": QUICK.max_reps,
                            "method": "events around the Python call (GPU idle, L2 flushed; the calls of a case "
                                      "taking turns)"} for name in ("a", "b")}


def test_each_round_takes_the_calls_in_an_order_of_its_own_so_each_follows_each_other() -> None:
    """A fixed order, or one turned a place each round, has the same call follow PyTorch's every time."""
    log: list[tuple[str, str]] = []
    time_user_calls_in_turn([user_call(log, name) for name in "abcd"], QUICK, lambda: None,
                            lambda key, error: pytest.fail(f"{key}: {error}"))
    samples = [name for kind, name in log if kind == "sample"]
    assert all(samples.count(name) == QUICK.max_reps for name in "abcd")
    rounds = [samples[4 * turn:4 * turn + 4] for turn in range(QUICK.max_reps)]
    assert all(sorted(order) == list("abcd") for order in rounds)
    follows = {(order[i - 1], order[i]) for order in rounds for i in range(1, 4)}
    assert follows == {(x, y) for x in "abcd" for y in "abcd" if x != y}
    assert rounds == [turn_order(list("abcd"), turn) for turn in range(QUICK.max_reps)]  # seeded: a run repeats


def test_a_failing_call_is_reported_and_left_out_while_the_others_go_on() -> None:
    log: list[tuple[str, str]] = []
    failures: list[tuple[str, str]] = []
    warm_ups = QUICK.warmup_calls
    timed = time_user_calls_in_turn([user_call(log, "a", fails_at=warm_ups + 2), user_call(log, "b")], QUICK,
                                    lambda: None, lambda key, error: failures.append((key, str(error))))
    assert failures == [("a", "a broke")]
    assert list(timed) == ["b"] and timed["b"]["samples"] == QUICK.max_reps
    samples = [name for kind, name in log if kind == "sample"]
    # a's third sample breaks it, in the third round; from then on b alone
    assert samples[:5] == turn_order(["a", "b"], 0) + turn_order(["a", "b"], 1) + ["b"]


def test_one_call_alone_keeps_the_plain_method_and_raises_its_error() -> None:
    log: list[tuple[str, str]] = []
    alone = user_call(log, "a")
    timed = time_user_calls(alone.device, alone.call, QUICK, lambda: None)
    assert timed["method"] == USER_CALL_METHOD == "events around the Python call (GPU idle, L2 flushed)"
    broken = user_call(log, "b", fails_at=0)
    with pytest.raises(RuntimeError, match="^b broke$"):
        time_user_calls(broken.device, broken.call, QUICK, lambda: None)
