"""Memory planning, between placement and execution.

lifetimes.py: which intermediates of a compiled program need memory and from when to when
(view groups, in place, Concat slices, workspaces); planner.py: their offsets in one arena;
limits.py and scratch.py: the memory limit, per tensor and per kernel's scratch; report.py: the
plan as text, a table or HTML; manager.py: plans per input signature (LRU), the arena, leases.
Nothing here binds a plan to the kernels or runs it: that is opwarden/execute.
"""
