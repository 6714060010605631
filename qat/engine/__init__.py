"""The rewrite engine the passes share.

  config           -> the one validated `RewriteConfig`
  preconditions    -> graph resolution and the refusals before a rewrite
  rewrite          -> a rewrite planned, checked, then applied
  rewrite_cycles   -> no rewrite makes a cycle (checked before it applies)
  node_batch       -> new ops written as NodeDefs, added with one import
  graph_import     -> that import, in C++, and the new ops' Python wrappers
  marks            -> the `_qat` attribute on qat's ops
  op_index         -> a graph's ops by type, indexed once and extended:
                      passes that look for rare ops ask it, not every op
  node_attrs       -> a NodeDef's attributes without TensorFlow's `_` ones
  function_library -> the graph's function library, the op types that call
                      functions, the functions a node names
  static_values    -> the constant evaluator: values known when the graph is
                      built, a loop's counters and number of steps
  step_counter     -> the shared quantization step
  range_variables  -> qat's variables of the model's kind
  function_graphs  -> rewriting a tf.function's graph while it is traced
  placement        -> devices of new ops and variables
  xla_compilation  -> whether XLA compiles the gradient being built
  recipes          -> `Recipe`: what precision each layer gets, as data
"""
