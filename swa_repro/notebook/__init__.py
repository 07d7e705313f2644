"""Layer 4: what notebooks show: story rows, plots, checks, the papermill runner, matrices.
Imports every layer below; only ``swa_repro.cli`` sits above it.
"""
