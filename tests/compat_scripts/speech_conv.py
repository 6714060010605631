"""Keyword spotting in the style of tensorflow/examples/speech_commands (TF 1.x).

The "conv" model of models.py on raw tf.nn ops, trained as train.py does
(`--quantize` calls tf.contrib.quantize.create_training_graph) and frozen as
freeze.py does (`--mode=freeze`: create_eval_graph, restore, freeze). Random
fingerprints stand in for the audio. The one line after the docstring is the
only one added for TF 2.
"""
import qat.compat; qat.compat.install()
import argparse
import os
import sys

import numpy as np
import tensorflow as tf

FLAGS = None


def prepare_model_settings():
    return {"fingerprint_width": 10, "spectrogram_length": 16,
            "fingerprint_size": 160, "label_count": 4}


def create_conv_model(fingerprint_input, model_settings, is_training):
    if is_training:
        dropout_rate = tf.compat.v1.placeholder(tf.float32, name='dropout_rate')
    input_frequency_size = model_settings['fingerprint_width']
    input_time_size = model_settings['spectrogram_length']
    fingerprint_4d = tf.reshape(fingerprint_input,
                                [-1, input_time_size, input_frequency_size, 1])
    first_filter_width = 8
    first_filter_height = 20
    first_filter_count = 8
    first_weights = tf.compat.v1.get_variable(
        name='first_weights',
        initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.01),
        shape=[first_filter_height, first_filter_width, 1, first_filter_count])
    first_bias = tf.compat.v1.get_variable(
        name='first_bias', initializer=tf.compat.v1.zeros_initializer,
        shape=[first_filter_count])
    first_conv = tf.nn.conv2d(input=fingerprint_4d, filters=first_weights,
                              strides=[1, 1, 1, 1], padding='SAME') + first_bias
    first_relu = tf.nn.relu(first_conv)
    if is_training:
        first_dropout = tf.nn.dropout(first_relu, rate=dropout_rate)
    else:
        first_dropout = first_relu
    max_pool = tf.nn.max_pool2d(input=first_dropout, ksize=[1, 2, 2, 1],
                                strides=[1, 2, 2, 1], padding='SAME')
    second_filter_width = 4
    second_filter_height = 10
    second_filter_count = 8
    second_weights = tf.compat.v1.get_variable(
        name='second_weights',
        initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.01),
        shape=[second_filter_height, second_filter_width, first_filter_count,
               second_filter_count])
    second_bias = tf.compat.v1.get_variable(
        name='second_bias', initializer=tf.compat.v1.zeros_initializer,
        shape=[second_filter_count])
    second_conv = tf.nn.conv2d(input=max_pool, filters=second_weights,
                               strides=[1, 1, 1, 1], padding='SAME') + second_bias
    second_relu = tf.nn.relu(second_conv)
    if is_training:
        second_dropout = tf.nn.dropout(second_relu, rate=dropout_rate)
    else:
        second_dropout = second_relu
    second_conv_shape = second_dropout.get_shape()
    second_conv_output_width = second_conv_shape[2]
    second_conv_output_height = second_conv_shape[1]
    second_conv_element_count = int(
        second_conv_output_width * second_conv_output_height * second_filter_count)
    flattened_second_conv = tf.reshape(second_dropout,
                                       [-1, second_conv_element_count])
    label_count = model_settings['label_count']
    final_fc_weights = tf.compat.v1.get_variable(
        name='final_fc_weights',
        initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.01),
        shape=[second_conv_element_count, label_count])
    final_fc_bias = tf.compat.v1.get_variable(
        name='final_fc_bias', initializer=tf.compat.v1.zeros_initializer,
        shape=[label_count])
    final_fc = tf.matmul(flattened_second_conv, final_fc_weights) + final_fc_bias
    if is_training:
        return final_fc, dropout_rate
    else:
        return final_fc


def train():
    model_settings = prepare_model_settings()
    fingerprint_size = model_settings['fingerprint_size']
    label_count = model_settings['label_count']
    fingerprint_input = tf.compat.v1.placeholder(
        tf.float32, [None, fingerprint_size], name='fingerprint_input')
    logits, dropout_rate = create_conv_model(fingerprint_input, model_settings,
                                             is_training=True)
    ground_truth_input = tf.compat.v1.placeholder(
        tf.int64, [None], name='groundtruth_input')
    control_dependencies = []
    with tf.compat.v1.name_scope('cross_entropy'):
        cross_entropy_mean = tf.compat.v1.losses.sparse_softmax_cross_entropy(
            labels=ground_truth_input, logits=logits)
    if FLAGS.quantize:
        tf.contrib.quantize.create_training_graph(quant_delay=FLAGS.quant_delay)
    with tf.compat.v1.name_scope('train'), tf.control_dependencies(
            control_dependencies):
        learning_rate_input = tf.compat.v1.placeholder(
            tf.float32, [], name='learning_rate_input')
        train_step = tf.compat.v1.train.GradientDescentOptimizer(
            learning_rate_input).minimize(cross_entropy_mean)
    saver = tf.compat.v1.train.Saver(tf.compat.v1.global_variables())
    rng = np.random.RandomState(0)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(FLAGS.how_many_training_steps):
            loss, _ = sess.run([cross_entropy_mean, train_step], feed_dict={
                fingerprint_input: rng.uniform(0, 1, (8, fingerprint_size)),
                ground_truth_input: rng.randint(0, label_count, 8),
                learning_rate_input: 0.01,
                dropout_rate: 0.5})
            print('Step #%d: cross entropy %f' % (step, loss))
        saver.save(sess, os.path.join(FLAGS.train_dir, 'conv.ckpt'))


def freeze():
    model_settings = prepare_model_settings()
    fingerprint_input = tf.compat.v1.placeholder(
        tf.float32, [None, model_settings['fingerprint_size']],
        name='fingerprint_input')
    logits = create_conv_model(fingerprint_input, model_settings,
                               is_training=False)
    tf.nn.softmax(logits, name='labels_softmax')
    if FLAGS.quantize:
        tf.contrib.quantize.create_eval_graph()
    with tf.compat.v1.Session() as sess:
        saver = tf.compat.v1.train.Saver(tf.compat.v1.global_variables())
        saver.restore(sess, os.path.join(FLAGS.train_dir, 'conv.ckpt'))
        frozen_graph_def = tf.compat.v1.graph_util.convert_variables_to_constants(
            sess, sess.graph_def, ['labels_softmax'])
    tf.io.write_graph(frozen_graph_def, os.path.dirname(FLAGS.output_file),
                      os.path.basename(FLAGS.output_file), as_text=False)
    print('Saved frozen graph to %s' % FLAGS.output_file)


def main(_):
    tf.compat.v1.disable_eager_execution()
    if FLAGS.mode == 'train':
        train()
    else:
        freeze()


if __name__ == '__main__':
    parser = argparse.ArgumentParser()
    parser.add_argument('--mode', choices=['train', 'freeze'], default='train')
    parser.add_argument('--train_dir', type=str, default='/tmp/speech_commands_train')
    parser.add_argument('--output_file', type=str, default='/tmp/conv_frozen.pb')
    parser.add_argument('--how_many_training_steps', type=int, default=3)
    parser.add_argument('--quantize', type=bool, default=False)
    parser.add_argument('--quant_delay', type=int, default=0)
    FLAGS, unparsed = parser.parse_known_args()
    main([sys.argv[0]] + unparsed)
