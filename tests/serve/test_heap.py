"""`api.heap`: a background build pauses the collector and shortens the switch interval, and the last build to
end restores both and freezes what was built; thaw gives it back to the collector."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest

from coding_agent_env.api import heap


@pytest.fixture
def thawed() -> Iterator[None]:
    yield
    heap.thaw()


def test_nested_builds_restore_what_the_first_found(thawed: None) -> None:
    interval = sys.getswitchinterval()
    assert gc.isenabled()
    with heap.building():
        assert not gc.isenabled() and sys.getswitchinterval() == heap.BUILD_SWITCH_INTERVAL_S
        with heap.building():
            built = [{"made": "during the build"}]
        assert not gc.isenabled(), "the outer build is still running"
        assert gc.get_freeze_count() == 0
    assert gc.isenabled() and sys.getswitchinterval() == interval
    assert gc.get_freeze_count() > 0 and built
    heap.thaw()
    assert gc.get_freeze_count() == 0


def test_a_failed_build_restores_too(thawed: None) -> None:
    interval = sys.getswitchinterval()
    with pytest.raises(RuntimeError), heap.building():
        raise RuntimeError("the build failed")
    assert gc.isenabled() and sys.getswitchinterval() == interval


def test_a_collector_the_operator_turned_off_stays_off(thawed: None) -> None:
    gc.disable()
    try:
        with heap.building():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_freeze_freezes_what_is_alive(thawed: None) -> None:
    heap.freeze()
    assert gc.get_freeze_count() > 0
