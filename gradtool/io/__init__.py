"""Dump I/O: one module per format, format detection from magic bytes, and the atomic writer.

A *dump* is one training step's gradients: an ordered mapping tensor name -> array plus metadata (at least
``step``). Readers are lazy: opening reads only the index; each tensor is read on access.
"""
