"""The scores' math and what pins it: EPS, statistics, the frozen suite and reference, the golden set,
and Capability breakdowns."""
