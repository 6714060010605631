"""Models written the TF 2 way, and their training loops, for the quantize_model tests.

Keras 3 is imported as `keras` (the Keras 3 package, whatever
TF_USE_LEGACY_KERAS says about `tf.keras`).
"""
import functools

import numpy as np
import tensorflow as tf

import digits_util


def keras():
    import keras as keras3  # pylint: disable=g-import-not-at-top
    return keras3


def subclassed_cnn():
    """A Keras 3 subclassed CNN: conv + BN + ReLU6, depthwise + BN, 1x1 conv + BN, pool, dense.

    Its class is registered with Keras (`qat_tests>DigitsNet`) and has a
    get_config, as Keras's own saving asks of a subclassed model.
    """
    return _digits_net_class()()


@functools.lru_cache(maxsize=None)
def _digits_net_class():
    k = keras()

    @k.saving.register_keras_serializable(package="qat_tests")
    class DigitsNet(k.Model):

        def __init__(self, **kwargs):
            super().__init__(**{"name": "digits_net", **kwargs})
            self.conv = k.layers.Conv2D(16, 3, padding="same", use_bias=False)
            self.bn1 = k.layers.BatchNormalization()
            self.depthwise = k.layers.DepthwiseConv2D(3, padding="same", use_bias=False)
            self.bn2 = k.layers.BatchNormalization()
            self.pointwise = k.layers.Conv2D(32, 1, use_bias=False)
            self.bn3 = k.layers.BatchNormalization()
            self.pool = k.layers.GlobalAveragePooling2D()
            self.logits = k.layers.Dense(10)

        def call(self, x, training=False):
            x = k.ops.relu6(self.bn1(self.conv(x), training=training))
            x = k.ops.relu6(self.bn2(self.depthwise(x), training=training))
            x = k.ops.relu6(self.bn3(self.pointwise(x), training=training))
            return self.logits(self.pool(x))

        def get_config(self):
            return {"name": self.name}

    return DigitsNet


def functional_cnn(softmax=False):
    """A Keras 3 functional CNN for compile / fit."""
    k = keras()
    inputs = k.Input((8, 8, 1), name="images")
    x = k.layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)
    x = k.layers.BatchNormalization()(x)
    x = k.layers.ReLU(6.0)(x)
    x = k.layers.Conv2D(32, 3, strides=2, padding="same")(x)
    x = k.layers.ReLU()(x)
    x = k.layers.GlobalAveragePooling2D()(x)
    outputs = k.layers.Dense(10, activation="softmax" if softmax else None)(x)
    return k.Model(inputs, outputs, name="digits_functional")


class ModuleCNN(tf.Module):
    """A tf.Module of tf.Variables and tf.nn ops: conv + batch norm (moving
    averages updated in training) + ReLU, conv + ReLU, mean, matmul."""

    def __init__(self, seed=0):
        super().__init__(name="module_cnn")
        rng = np.random.RandomState(seed)

        def var(shape, scale):
            return tf.Variable(rng.normal(0, scale, shape).astype(np.float32))

        self.w1 = var([3, 3, 1, 16], 0.3)
        self.gamma = tf.Variable(tf.ones([16]))
        self.beta = tf.Variable(tf.zeros([16]))
        self.moving_mean = tf.Variable(tf.zeros([16]), trainable=False)
        self.moving_variance = tf.Variable(tf.ones([16]), trainable=False)
        self.w2 = var([3, 3, 16, 32], 0.1)
        self.b2 = tf.Variable(tf.zeros([32]))
        self.w3 = var([32, 10], 0.2)
        self.b3 = tf.Variable(tf.zeros([10]))

    def __call__(self, x, training=False):
        x = tf.nn.conv2d(x, self.w1, 1, "SAME")
        if training:
            mean, variance = tf.nn.moments(x, [0, 1, 2])
            self.moving_mean.assign(self.moving_mean * 0.9 + mean * 0.1)
            self.moving_variance.assign(self.moving_variance * 0.9 + variance * 0.1)
        else:
            mean, variance = self.moving_mean, self.moving_variance
        x = tf.nn.relu(tf.nn.batch_normalization(x, mean, variance, self.beta, self.gamma, 1e-3))
        x = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, self.w2, 2, "SAME"), self.b2))
        x = tf.reduce_mean(x, [1, 2])
        return tf.matmul(x, self.w3) + self.b3


def adam_step(model, learning_rate, jit_compile=None):
    """A tf.function GradientTape training step of `model` (Adam, logits);
    `jit_compile=True`: compiled by XLA."""
    return gradient_step(model, keras().optimizers.Adam(learning_rate), jit_compile)


def gradient_step(model, optimizer, jit_compile=None):
    """A tf.function GradientTape training step of `model` with `optimizer`
    (logits); `jit_compile=True`: compiled by XLA."""
    loss_fn = keras().losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(jit_compile=jit_compile)
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    return step


def train(model, steps, learning_rate, seed, batch=32, jit_compile=None):
    """`steps` Adam steps of a tf.function GradientTape loop on the digits."""
    (x, y), _ = digits_util.digits_split()
    step = adam_step(model, learning_rate, jit_compile)

    rng = np.random.RandomState(seed)
    loss = None
    for _ in range(steps):
        b = rng.randint(0, len(x), batch)
        loss = step(x[b], y[b])
    return float(loss)


def accuracy(logits, labels):
    return float(np.mean(np.argmax(np.asarray(logits), -1) == labels))


def assert_same_state(original, copy, x):
    """`copy` has `original`'s variables (model, qat's ranges and step counter,
    optimizer), value for value, and the same eval outputs on `x`."""
    pairs = list(zip(original.variables, copy.variables))
    optimizers = [getattr(m, "optimizer", None) for m in (original, copy)]
    if all(o is not None for o in optimizers):
        np.testing.assert_equal(len(optimizers[0].variables), len(optimizers[1].variables))
        pairs += list(zip(optimizers[0].variables, optimizers[1].variables))
    np.testing.assert_equal(len(original.variables), len(copy.variables))
    for a, b in pairs:
        np.testing.assert_array_equal(a.numpy(), b.numpy(),
                                      err_msg=f"{_path(a)} differs from {_path(b)}")
    np.testing.assert_array_equal(np.asarray(original(x, training=False)),
                                  np.asarray(copy(x, training=False)))


def quantization_step(qm) -> int:
    """The value of qat's step counter of a quantized Keras model."""
    return int(next(v for v in qm.rewriter.store.ordered if v.dtype == tf.int64).numpy())


def _path(variable) -> str:
    return getattr(variable, "path", None) or variable.name
