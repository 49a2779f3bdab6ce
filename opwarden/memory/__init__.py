"""Memory primitives below every layer: read-only buffers for feeds and weights (`constants`),
huge-page mappings for weights and scratch (`hugepages`)."""
