"""The openvino device: operators run through OpenVINO's runtime (its CPU plugin here).

`provider` is the device (importing it imports openvino and registers it; the devices registry
loads it on first need, only when the package imports); `convert` builds the ONNX models
OpenVINO reads (one node for capability queries and single-node variants, a region's nodes for
its compiled model); `region` runs a compiled region as one step: shape-signature LRU of
compiled models, zero-copy feeds and outputs, per-node times from OpenVINO's profiling, the CPU
rerun and the first-bad-node diagnosis the guard asks for on a fault.
"""
