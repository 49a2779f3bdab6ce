"""Load time of large or hostile graph shapes (opwarden.ir.load only: parse, inference, IR).

    python benchmarks/load_graphs.py [--nodes 20000] [--levels 17] [--repeat 3]

Shapes: a Relu chain in file order and reversed (the toposort reorders every node), a wide
graph (NODES Relus of one input summed), an If branch reading NODES outer values (captures),
and model-local functions each calling the next twice, LEVELS deep (2^(LEVELS-1) nodes after
inlining; past the inlining limit the load is refused, and the time to refuse is reported).
Reported: the best of REPEAT loads, in seconds.
"""

from __future__ import annotations

import argparse
import time

from onnx import TensorProto, helper

from opwarden.errors import ModelError
from opwarden.ir.load import load

OPSET = [helper.make_opsetid("", 17)]


def _vi(name, shape=(4,), elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, list(shape))


def _bytes(nodes, inputs, outputs, functions=(), opsets=OPSET) -> bytes:
    g = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(g, opset_imports=list(opsets),
                             functions=list(functions)).SerializeToString()


def chain(n: int, reverse: bool = False) -> bytes:
    nodes = [helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"], name=f"n{i}") for i in range(n)]
    return _bytes(nodes[::-1] if reverse else nodes, [_vi("v0")], [_vi(f"v{n}")])


def wide(n: int) -> bytes:
    nodes = [helper.make_node("Relu", ["x"], [f"r{i}"], name=f"n{i}") for i in range(n)]
    nodes.append(helper.make_node("Sum", [f"r{i}" for i in range(n)], ["y"], name="sum"))
    return _bytes(nodes, [_vi("x")], [_vi("y")])


def captures(n: int) -> bytes:
    nodes = [helper.make_node("Relu", ["x"], [f"r{i}"], name=f"n{i}") for i in range(n)]
    then = helper.make_graph([helper.make_node("Sum", [f"r{i}" for i in range(n)], ["t"])],
                             "then", [], [_vi("t")])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [_vi("e")])
    nodes.append(helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other))
    return _bytes(nodes, [_vi("x"), _vi("c", (), TensorProto.BOOL)], [_vi("y")])


def nested_functions(levels: int) -> bytes:
    local = OPSET + [helper.make_opsetid("local", 1)]
    fns = []
    for k in range(levels):
        if k == levels - 1:
            body = [helper.make_node("Relu", ["x"], ["y"])]
        else:
            body = [helper.make_node(f"f{k + 1}", ["x"], ["t"], domain="local"),
                    helper.make_node(f"f{k + 1}", ["t"], ["y"], domain="local")]
        fns.append(helper.make_function("local", f"f{k}", ["x"], ["y"], body, local))
    call = helper.make_node("f0", ["a"], ["b"], domain="local", name="call")
    return _bytes([call], [_vi("a")], [_vi("b")], fns, local)


def best(data: bytes, repeat: int) -> tuple[float, str]:
    times, what = [], ""
    for _ in range(repeat):
        t = time.perf_counter()
        try:
            what = f"{len(load(data).graph.nodes)} nodes"
        except ModelError as e:
            what = f"refused: {str(e)[:60]}..."
        times.append(time.perf_counter() - t)
    return min(times), what


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=20_000)
    ap.add_argument("--levels", type=int, default=17)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    cases = {
        f"chain {a.nodes}": chain(a.nodes),
        f"reversed chain {a.nodes}": chain(a.nodes, reverse=True),
        f"wide {a.nodes}": wide(a.nodes),
        f"if reading {a.nodes} outer values": captures(a.nodes),
        f"functions {a.levels} levels": nested_functions(a.levels),
        f"functions {a.levels + 5} levels": nested_functions(a.levels + 5),
    }
    for name, data in cases.items():
        t, what = best(data, a.repeat)
        print(f"{name:<34} {len(data):>9} B  {t:7.3f} s  {what}")


if __name__ == "__main__":
    main()
