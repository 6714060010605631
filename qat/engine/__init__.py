"""The rewrite engine the passes share.

`node_batch` writes new ops as NodeDefs and adds them with one import;
`step_counter` is the shared quantization step.
"""
