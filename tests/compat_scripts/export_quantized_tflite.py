"""Exports a trained slim classifier to a quantized TFLite model (TF 1.x style).

As slim/export_inference_graph.py and the TF 1.x TFLite guide did: build the
inference graph (is_training=False), contrib.quantize.create_eval_graph(),
restore the training checkpoint with a plain Saver, evaluate, freeze, and
convert with tf.lite.TFLiteConverter (uint8). The one line after the
docstring is the only one added for TF 2.
"""
import qat.compat; qat.compat.install()
import os

from absl import app
from absl import flags
import numpy as np
from sklearn import datasets
import tensorflow.compat.v1 as tf
from tensorflow.contrib import quantize as contrib_quantize
from tensorflow.contrib import slim

import lenet_bn

flags.DEFINE_string('checkpoint_dir', '/tmp/tfmodel/',
                    'Directory with the training checkpoints.')
flags.DEFINE_string('output_dir', '/tmp/tfmodel_export/',
                    'Where the frozen graph and the .tflite model go.')
flags.DEFINE_bool('quantize', True, 'Whether the model was trained quantized.')
FLAGS = flags.FLAGS


def main(_):
  tf.disable_v2_behavior()
  digits = datasets.load_digits()
  x_test = (digits.images[1400:] / 16.0).astype(np.float32)[..., None]
  y_test = digits.target[1400:]
  with tf.Graph().as_default() as graph:
    placeholder = tf.placeholder(name='input', dtype=tf.float32,
                                 shape=[None, 8, 8, 1])
    with slim.arg_scope(lenet_bn.lenet_bn_arg_scope()):
      logits, end_points = lenet_bn.lenet_bn(placeholder, num_classes=10,
                                             is_training=False)
    predictions = end_points['Predictions']
    if FLAGS.quantize:
      contrib_quantize.create_eval_graph()
    saver = tf.train.Saver()
    with tf.Session() as sess:
      saver.restore(sess, tf.train.latest_checkpoint(FLAGS.checkpoint_dir))
      probabilities = sess.run(predictions, {placeholder: x_test})
      accuracy = np.mean(np.argmax(probabilities, 1) == y_test)
      print('eval graph accuracy: %.4f' % accuracy)
      frozen = tf.graph_util.convert_variables_to_constants(
          sess, graph.as_graph_def(), [predictions.op.name])
      tf.io.write_graph(frozen, FLAGS.output_dir, 'frozen.pb', as_text=False)
      converter = tf.lite.TFLiteConverter.from_session(
          sess, [placeholder], [predictions])
      converter.inference_type = tf.uint8
      converter.quantized_input_stats = {'input': (0., 255.)}
      tflite_model = converter.convert()
  with open(os.path.join(FLAGS.output_dir, 'model.tflite'), 'wb') as f:
    f.write(tflite_model)

  interpreter = tf.lite.Interpreter(model_content=tflite_model)
  interpreter.allocate_tensors()
  input_details = interpreter.get_input_details()[0]
  output_details = interpreter.get_output_details()[0]
  correct = 0
  for image, label in zip(x_test, y_test):
    quantized = np.round(image * 255.0).astype(np.uint8)[None]
    interpreter.set_tensor(input_details['index'], quantized)
    interpreter.invoke()
    correct += int(np.argmax(interpreter.get_tensor(output_details['index'])) == label)
  print('tflite accuracy: %.4f' % (correct / len(y_test)))


if __name__ == '__main__':
  app.run(main)
