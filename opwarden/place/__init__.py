"""Placement: which device and kernel runs each node of a validated, optimized model, and why.

`place_model` runs the rewrites in flow order, one module each:

1. facts.py: the output facts shape inference left unknown (only when a device profile, which
   checks dtypes, layouts and memory, is in the list);
2. partition.py: a device per node, in the session's order of devices, with each refusal in
   words; decompose.py rewrites a node through its ONNX function body where that lets a device
   run it;
3. fit.py: partitions too big for a device's activation memory move to the next device;
4. with fallback="forbid", one error for every node off the first device (partition.py);
5. copies.py: DeviceCopy nodes on the edges between devices;
6. layout.py (with layout_shuffle.py): NHWC regions where devices want channels-last, with the
   layout conversions they need;
7. partition.py: a kernel variant per node, on its device, in its layout.

Subgraphs (If/Loop/Scan bodies) are partitioned on the host devices in NCHW (`place_graph`).
summary.py turns the placements into the `explain` summary.
"""

from __future__ import annotations

from typing import Any

from opwarden.devices import get_device
from opwarden.ir.graph import Model
from opwarden.ir.validate import graphs_of
from opwarden.place.copies import insert_copies
from opwarden.place.facts import complete_facts
from opwarden.place.fit import fit_memory
from opwarden.place.layout import unify
from opwarden.place.partition import (
    Partitioner,
    Placement,
    Placements,
    forbid_fallback,
    place_graph,
    placements,
)
from opwarden.place.regions import compiles_regions, finish, group_regions

__all__ = ["Placement", "Placements", "place_graph", "place_model"]


def place_model(
    model: Model, devices: list[str], options: Any, quarantine: Any = None
) -> Placements:
    """Partition, copy, lay out and choose kernels for every graph of `model`, in order."""
    devs = [get_device(d) for d in devices]
    g = model.graph
    if any(d.kind == "profile" or compiles_regions(d) for d in devs):
        complete_facts(g, model.opsets)
    part = Partitioner(devs, model.opsets, quarantine)
    part.graph(g)
    fit_memory(g, part)
    if getattr(options, "fallback", "allow") == "forbid":
        forbid_fallback(g, devs, part.assign)
    regions = group_regions(g, part, options, model.opsets)
    copies = insert_copies(g, part.assign)
    device_of = {k: a.device for k, a in part.assign.items()}
    layouts, lrep = unify(g, device_of, model.opsets.get("", 13), quarantine,
                          getattr(options, "optimization_level", 3) >= 3)
    out = Placements(
        placements(g, device_of, layouts, part.assign, copies, lrep.inserted, quarantine)
    )
    finish(out, regions)
    for sub in graphs_of(model)[1:]:
        out.extend(place_graph(sub, devices, model.opsets, quarantine=quarantine))
    out.report = {
        "devices": [d.name for d in devs],
        "simulated": [d.name for d in devs if d.simulated],
        "copies_inserted": len(copies),
        "removed": dict(g.removed),
        **lrep.as_dict(),
    }
    return out
