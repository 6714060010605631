"""Clients of `qat.graph_editor` outside the QAT pipeline.

`gradient_checkpointing`: sublinear-memory gradients by recomputation.
"""
