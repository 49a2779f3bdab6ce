"""Running a compiled program.

program.py: `Program` (steps over slots), binding a leased memory plan to the kernels and the
generic, guarded and memory-debugging loops; codegen.py: the lean loop compiled to Python;
parallel.py: the wavefront loop on a thread pool; bound.py: `BoundGraph`, a subgraph bound
to its captured values.
"""
