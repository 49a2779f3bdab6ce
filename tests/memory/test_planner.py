"""Property tests of the arena planner on random lifetime sets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from opwarden.plan.planner import ALIGNMENT, Buffer, assign_offsets, build_plan, lower_bound

intervals = st.lists(
    st.tuples(
        st.integers(1, 1 << 20),  # size
        st.integers(0, 60),  # first step
        st.integers(0, 20),  # length
    ),
    min_size=0,
    max_size=60,
)


def _buffers(spec):
    return [
        Buffer(f"b{i}", "p", (size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT, f, f + n)
        for i, (size, f, n) in enumerate(spec)
    ]


@settings(max_examples=300, deadline=None)
@given(intervals)
def test_live_buffers_never_overlap(spec):
    plan = build_plan(_buffers(spec), ["s"] * 100)
    bs = plan.buffers
    for i, a in enumerate(bs):
        assert a.offset % ALIGNMENT == 0
        assert a.offset + a.nbytes <= plan.arena_bytes
        for b in bs[i + 1 :]:
            if a.last < b.first or b.last < a.first:
                continue  # not live at the same time
            assert a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset, (a, b)
    plan.check()


@settings(max_examples=300, deadline=None)
@given(intervals)
def test_arena_at_least_lower_bound_and_at_most_naive(spec):
    plan = build_plan(_buffers(spec), ["s"] * 100)
    assert plan.lower_bound_bytes <= plan.arena_bytes <= plan.naive_bytes


@settings(max_examples=100, deadline=None)
@given(intervals)
def test_plans_are_deterministic(spec):
    a = build_plan(_buffers(spec), ["s"] * 100)
    b = build_plan(_buffers(spec), ["s"] * 100)
    assert [x.offset for x in a.buffers] == [x.offset for x in b.buffers]
    assert a.arena_bytes == b.arena_bytes


def test_lower_bound_is_peak_of_live_bytes():
    # three buffers: A [0,2], B [1,3], C [3,4]: peak at steps 1-2 (A+B) or 3 (B+C)
    assert lower_bound([100, 200, 400], [0, 1, 3], [2, 3, 4]) == 600
    offs, top = assign_offsets([100, 200, 400], [0, 1, 3], [2, 3, 4])
    assert top >= 600


def test_disjoint_lifetimes_share_memory():
    offs, top = assign_offsets([1024, 1024, 1024], [0, 1, 2], [0, 1, 2])
    assert top == 1024 and offs == [0, 0, 0]
