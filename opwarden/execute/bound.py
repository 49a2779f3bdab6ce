"""`BoundGraph`: a subgraph attribute (Loop/If/Scan body) bound to its captured values.

Its own module so the executor, which builds them, and the lean loop's code generator, which
names the class in generated code, both import it one way.
"""

from __future__ import annotations

from typing import Any


class BoundGraph:
    """A subgraph attribute at run time: call it with the subgraph's inputs, get its outputs.

    Control-flow kernels also read from it what bounds their iterations: `memory_limit` (the
    session's) and `deadline` (the run's, or None).
    """

    # program: the body's execute.program.Program (not imported: program.py imports this module).
    __slots__ = ("program", "captured", "guard", "deadline")

    def __init__(
        self, program: Any, captured: list[Any], guard: Any = None, deadline: Any = None
    ) -> None:
        self.program = program
        self.captured = captured
        self.guard = guard
        self.deadline = deadline

    @property
    def memory_limit(self) -> int | None:
        return self.program.memory_limit

    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.program.graph.inputs]

    @property
    def output_names(self) -> list[str]:
        return [v.name for v in self.program.graph.outputs]

    def __call__(self, *inputs: Any) -> list[Any]:
        if self.guard is not None:
            return self.program.run_guarded(
                list(inputs), self.captured, self.guard, deadline=self.deadline
            )
        return self.program.run(list(inputs), self.captured)
