"""qat.graph_editor: the tf.contrib.graph_editor API on live TensorFlow 2 graphs."""
