"""The benchmark harness: plans scenarios from model configs, runs every candidate schedule on a backend
(GPU through torchrun, CPU gloo, or the analytic simulator), and writes the resumable labelled dataset;
``fleet/`` runs one sweep as shards across machines.

Nothing heavy is imported here: torch, pandas and matplotlib load inside the functions that need them.
"""
