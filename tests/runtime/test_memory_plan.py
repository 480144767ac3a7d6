"""Static memory plan: safety on random interval sets, reuse, alignment, speed."""
import random
import time

import pytest

from hidetc.backends.runtime.memory_plan import MemoryPlan, PlanValue, check_plan, plan_memory


def _aligned_total(values, alignment=64):
    return sum((v.nbytes + alignment - 1) // alignment * alignment for v in values)


def _random_values(rng: random.Random, n: int, steps: int) -> list[PlanValue]:
    values = []
    for i in range(n):
        first = rng.randrange(steps)
        last = min(steps - 1, first + rng.choice([0, 0, 1, 2, 5, rng.randrange(steps)]))
        nbytes = rng.choice([0, 1, 4, 63, 64, 100, 4096, rng.randrange(1, 1 << 20)])
        values.append(PlanValue(f"v{i}", nbytes, first, last))
    return values


@pytest.mark.parametrize("seed", range(30))
def test_random_plans_are_safe(seed):
    rng = random.Random(seed)
    values = _random_values(rng, rng.randrange(1, 200), rng.randrange(1, 60))
    plan = plan_memory(values)
    check_plan(values, plan)
    assert plan.total_bytes == sum(v.nbytes for v in values)
    assert plan.arena_bytes <= _aligned_total(values)
    assert set(plan.offsets) == {v.name for v in values}


def test_deterministic():
    values = _random_values(random.Random(7), 300, 40)
    assert plan_memory(values) == plan_memory(list(values))


def test_chain_reuses_memory():
    # v_i is written at step i and read at step i+1: only two are ever live together
    values = [PlanValue(f"v{i}", 1024, i, i + 1) for i in range(10)]
    plan = plan_memory(values)
    check_plan(values, plan)
    assert plan.total_bytes == 10 * 1024
    assert plan.arena_bytes == 2 * 1024


def test_closed_intervals_touching_at_a_step_do_not_share():
    a = PlanValue("a", 128, 0, 3)
    b = PlanValue("b", 128, 3, 5)  # written by the step that last reads a
    plan = plan_memory([a, b])
    check_plan([a, b], plan)
    assert plan.offsets["a"] != plan.offsets["b"]
    assert plan.arena_bytes == 256


def test_disjoint_lifetimes_share():
    values = [PlanValue("a", 1000, 0, 1), PlanValue("b", 1000, 2, 3)]
    plan = plan_memory(values)
    assert plan.offsets == {"a": 0, "b": 0}
    assert plan.arena_bytes == 1000


def test_best_fit_uses_a_gap():
    # big1 at [0,4096), small lives in between big blocks while 'hole' is dead
    values = [PlanValue("x", 4096, 0, 10), PlanValue("hole", 1024, 0, 1),
              PlanValue("y", 4096, 0, 10), PlanValue("small", 512, 5, 6)]
    plan = plan_memory(values)
    check_plan(values, plan)
    assert plan.arena_bytes == 4096 * 2 + 1024
    assert plan.offsets["small"] == plan.offsets["hole"]


@pytest.mark.parametrize("alignment", [1, 8, 64, 256])
def test_alignment(alignment):
    values = [PlanValue(f"v{i}", 3 + i, 0, 5) for i in range(20)]
    plan = plan_memory(values, alignment=alignment)
    check_plan(values, plan)
    assert all(off % alignment == 0 for off in plan.offsets.values())
    assert plan.alignment == alignment


def test_bad_alignment_and_inputs():
    with pytest.raises(ValueError, match="power of two"):
        plan_memory([], alignment=48)
    with pytest.raises(ValueError, match="twice"):
        plan_memory([PlanValue("a", 1, 0, 0), PlanValue("a", 1, 0, 0)])
    with pytest.raises(ValueError, match="before it is written"):
        plan_memory([PlanValue("a", 1, 3, 2)])


def test_empty_plan():
    plan = plan_memory([])
    assert plan == MemoryPlan(arena_bytes=0, offsets={}, total_bytes=0, alignment=64)
    check_plan([], plan)
    assert plan.to_dict() == {"arena_bytes": 0, "total_bytes": 0, "alignment": 64,
                              "offsets": {}}


def test_zero_byte_values():
    values = [PlanValue("z", 0, 0, 9), PlanValue("a", 64, 0, 9)]
    plan = plan_memory(values)
    check_plan(values, plan)
    assert plan.arena_bytes == 64


def test_check_plan_catches_overlap_misalignment_and_bounds():
    values = [PlanValue("a", 100, 0, 2), PlanValue("b", 100, 1, 3)]
    with pytest.raises(AssertionError, match="'a'.*'b'|'b'.*'a'"):
        check_plan(values, MemoryPlan(200, {"a": 0, "b": 64}, 200))
    with pytest.raises(AssertionError, match="aligned"):
        check_plan(values, MemoryPlan(300, {"a": 0, "b": 100}, 200))
    with pytest.raises(AssertionError, match="outside the arena"):
        check_plan(values, MemoryPlan(150, {"a": 0, "b": 128}, 200))
    with pytest.raises(AssertionError, match="no offset"):
        check_plan(values, MemoryPlan(150, {"a": 0}, 200))


def test_2000_values_are_fast():
    # a transformer-like schedule: many short-lived activations, some long-lived ones
    rng = random.Random(0)
    values = []
    for i in range(2000):
        span = rng.choice([1, 1, 1, 2, 3, 40, 400])
        values.append(PlanValue(f"t{i}", rng.choice([768, 3072, 12 * 128]) * 4 * 128,
                                i, min(1999, i + span)))
    start = time.perf_counter()
    plan = plan_memory(values)
    elapsed = time.perf_counter() - start
    check_plan(values, plan)
    assert elapsed < 1.0, f"planning 2,000 values took {elapsed:.2f} s"
    assert plan.arena_bytes < plan.total_bytes / 10


def test_2000_values_all_live_is_fast():
    values = [PlanValue(f"t{i}", 64 * (1 + i % 7), 0, 1) for i in range(2000)]
    start = time.perf_counter()
    plan = plan_memory(values)
    assert time.perf_counter() - start < 1.0
    check_plan(values, plan)
    assert plan.arena_bytes == plan.total_bytes


def test_shared_values_take_one_place_spanning_their_chain():
    """`shares`: b overwrites a in place (both live at step 1), c overwrites b; they get
    one offset, and d, live meanwhile, stays apart; total_bytes counts all four."""
    values = [PlanValue("a", 256, 0, 1), PlanValue("b", 256, 1, 2),
              PlanValue("c", 256, 2, 4), PlanValue("d", 128, 1, 3)]
    plan = plan_memory(values, shares={"b": "a", "c": "b"})
    assert plan.offsets["a"] == plan.offsets["b"] == plan.offsets["c"]
    d = plan.offsets["d"]
    assert d >= plan.offsets["a"] + 256 or d + 128 <= plan.offsets["a"]
    assert plan.arena_bytes == 384 and plan.total_bytes == 896
    check_plan([PlanValue("abc", 256, 0, 4), values[3]],
               MemoryPlan(plan.arena_bytes, {"abc": plan.offsets["a"], "d": d}, 384))
