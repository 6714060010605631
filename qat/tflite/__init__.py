"""Reading what qat built and what the TFLite converter made of it.

The room below `qat.export` and `qat.report`, which both read models this way:

  graph_structure -> what qat built in a graph: quantizers and their range
                     variables, layers, batch norms, the data path (read from
                     op types and edges, in this process or from a .meta file)
  names           -> which eval-graph tensor each TFLite tensor holds, read
                     from the names the converter gives its tensors
"""
