"""Switching a single-GPU host between profiles: `single_gpu` stops the old unit, waits for the
GPU to be free (`gpu`), deploys the new one, and restarts the old one if the new one fails."""
