"""BERT-style text encoders and the synthetic "does token 7 occur?" task.

Shared by tests/text_models_test.py and tools/finetune_text.py (issue #26).
Both encoders map int32 token ids `[batch, seq]` to 2-class logits:

* `bert_nn`: written as BERT's `modeling.py` writes it: `tf.gather` of a
  `[vocab, hidden]` embedding table (ids flattened first), learned position
  embeddings sliced to the sequence length and added, a layer norm
  (moments, rsqrt), then `blocks` transformer blocks on the `[batch * seq,
  hidden]` matrix: dense query / key / value, reshape / transpose to heads,
  `matmul(q, k^T) * 1/sqrt(d)`, optional attention-mask adder
  `(1 - mask) * -10000`, softmax, dropout, `matmul` with the values,
  transpose / reshape back, dense, dropout, residual, layer norm; a GELU
  (tanh approximation, `tf.pow(x, 3)`) feed-forward, dense, dropout, residual,
  layer norm; the pooler (dense + tanh on the first token), the logits.
* `bert_keras`: the same with tf_keras layers: `Embedding` for the tokens
  and for the positions (`tf.range`), `LayerNormalization`,
  `MultiHeadAttention`, `Dense(activation="gelu")`, `Dropout`.

`conv_text` is a text model the issue does not name: embeddings, 1-D
convolutions and global pooling.

`lookup` picks how `bert_nn` reads its embedding table: "gather"
(`tf.gather` of the variable's value), "embedding_lookup"
(`tf.nn.embedding_lookup`) or "resource" (`ResourceGather`, the resource
variable's `sparse_read`).
"""
import dataclasses
import math
from typing import Optional, Tuple

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

# The token whose presence the synthetic task asks about.
TARGET_TOKEN = 7


@dataclasses.dataclass(frozen=True)
class TextConfig:
    """Encoder size (issue #26: hidden 128, 4 heads, FFN 512, 4 blocks)."""
    vocab: int = 1000
    seq: int = 32
    hidden: int = 128
    heads: int = 4
    ffn: int = 512
    blocks: int = 4
    classes: int = 2
    dropout: float = 0.1


def _layer_norm(x: tf.Tensor, name: str) -> tf.Tensor:
    with tf1.variable_scope(name):
        channels = x.shape[-1]
        gamma = tf1.get_variable("gamma", [channels], initializer=tf1.ones_initializer())
        beta = tf1.get_variable("beta", [channels], initializer=tf1.zeros_initializer())
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(variance + 1e-12) * gamma + beta


def _gelu(x: tf.Tensor) -> tf.Tensor:
    """BERT's GELU (tanh approximation)."""
    cdf = 0.5 * (1.0 + tf.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * tf.pow(x, 3))))
    return x * cdf


def _dropout(x: tf.Tensor, rate: float, training: bool) -> tf.Tensor:
    return tf.nn.dropout(x, rate=rate) if training and rate else x


def _dense(x: tf.Tensor, units: int, name: str, activation=None) -> tf.Tensor:
    init = tf1.truncated_normal_initializer(stddev=0.02)
    return tf1.layers.dense(x, units, activation=activation, name=name,
                            kernel_initializer=init)


def _lookup(table, ids: tf.Tensor, lookup: str) -> tf.Tensor:
    if lookup == "gather":
        return tf.gather(table, ids)
    if lookup == "embedding_lookup":
        return tf.nn.embedding_lookup(table, ids)
    if lookup == "resource":
        return table.sparse_read(ids)
    raise ValueError("lookup must be gather, embedding_lookup or resource, not %r" % lookup)


def bert_nn(ids: tf.Tensor, training: bool, cfg: TextConfig = TextConfig(),
            mask: Optional[tf.Tensor] = None, lookup: str = "gather") -> tf.Tensor:
    """BERT's modeling.py encoder + pooler + logits (see the module)."""
    batch_seq = [-1, cfg.seq, cfg.hidden]
    size = cfg.hidden // cfg.heads
    init = tf1.truncated_normal_initializer(stddev=0.02)
    rate = cfg.dropout
    with tf1.variable_scope("bert"):
        with tf1.variable_scope("embeddings"):
            table = tf1.get_variable("word_embeddings", [cfg.vocab, cfg.hidden],
                                     initializer=init, use_resource=True)
            flat = tf.reshape(ids, [-1])
            words = _lookup(table if lookup != "gather" else table.value(), flat, lookup)
            out = tf.reshape(words, batch_seq)
            positions = tf1.get_variable("position_embeddings", [512, cfg.hidden],
                                         initializer=init)
            pos = tf.slice(positions, [0, 0], [cfg.seq, -1])
            out += tf.reshape(pos, [1, cfg.seq, cfg.hidden])
            out = _dropout(_layer_norm(out, "LayerNorm"), rate, training)
        adder = None
        if mask is not None:
            # BERT's create_attention_mask_from_input_mask and its adder.
            to_mask = tf.cast(tf.reshape(mask, [-1, 1, cfg.seq]), tf.float32)
            attention_mask = tf.ones([tf.shape(mask)[0], cfg.seq, 1]) * to_mask
            adder = (1.0 - tf.expand_dims(attention_mask, 1)) * -10000.0
        prev = tf.reshape(out, [-1, cfg.hidden])
        with tf1.variable_scope("encoder"):
            for b in range(cfg.blocks):
                with tf1.variable_scope("layer_%d" % b):
                    with tf1.variable_scope("attention"):
                        def heads(t):
                            t = tf.reshape(t, [-1, cfg.seq, cfg.heads, size])
                            return tf.transpose(t, [0, 2, 1, 3])
                        q = heads(_dense(prev, cfg.hidden, "query"))
                        k = heads(_dense(prev, cfg.hidden, "key"))
                        v = heads(_dense(prev, cfg.hidden, "value"))
                        scores = tf.matmul(q, k, transpose_b=True)
                        scores = tf.multiply(scores, 1.0 / math.sqrt(size))
                        if adder is not None:
                            scores += adder
                        probs = _dropout(tf.nn.softmax(scores), rate, training)
                        context = tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3])
                        context = tf.reshape(context, [-1, cfg.hidden])
                        with tf1.variable_scope("output"):
                            att = _dropout(_dense(context, cfg.hidden, "dense"), rate, training)
                            att = _layer_norm(att + prev, "LayerNorm")
                    inner = _gelu(_dense(att, cfg.ffn, "intermediate"))
                    with tf1.variable_scope("output"):
                        ffn = _dropout(_dense(inner, cfg.hidden, "dense"), rate, training)
                        prev = _layer_norm(ffn + att, "LayerNorm")
        last = tf.reshape(prev, batch_seq)
        with tf1.variable_scope("pooler"):
            first = tf.squeeze(last[:, 0:1, :], axis=1)
            pooled = _dense(first, cfg.hidden, "dense", activation=tf.tanh)
    return _dense(pooled, cfg.classes, "logits")


def bert_keras(ids: tf.Tensor, training: bool, cfg: TextConfig = TextConfig(),
               mask: Optional[tf.Tensor] = None) -> tf.Tensor:
    """The same encoder with tf_keras layers (see the module)."""
    import tf_keras as keras  # pylint: disable=g-import-not-at-top
    layers = keras.layers
    keras.backend.set_learning_phase(1 if training else 0)
    init = keras.initializers.TruncatedNormal(stddev=0.02)
    net = layers.Embedding(cfg.vocab, cfg.hidden, embeddings_initializer=init,
                           name="word_embeddings")(ids)
    positions = layers.Embedding(512, cfg.hidden, embeddings_initializer=init,
                                 name="position_embeddings")(tf.range(cfg.seq))
    net = net + positions
    net = layers.LayerNormalization(epsilon=1e-12, name="embeddings_norm")(net)
    net = layers.Dropout(cfg.dropout)(net, training=training)
    attention_mask = None
    if mask is not None:
        attention_mask = tf.cast(mask[:, None, :], tf.bool) & tf.ones(
            [1, cfg.seq, 1], tf.bool)
    for b in range(cfg.blocks):
        att = layers.MultiHeadAttention(cfg.heads, cfg.hidden // cfg.heads,
                                        dropout=cfg.dropout, kernel_initializer=init,
                                        name="attention_%d" % b)(
                                            net, net, attention_mask=attention_mask,
                                            training=training)
        att = layers.Dropout(cfg.dropout)(att, training=training)
        net = layers.LayerNormalization(epsilon=1e-12, name="attention_norm_%d" % b)(net + att)
        ffn = layers.Dense(cfg.ffn, activation="gelu", kernel_initializer=init,
                           name="intermediate_%d" % b)(net)
        ffn = layers.Dense(cfg.hidden, kernel_initializer=init, name="output_%d" % b)(ffn)
        ffn = layers.Dropout(cfg.dropout)(ffn, training=training)
        net = layers.LayerNormalization(epsilon=1e-12, name="output_norm_%d" % b)(net + ffn)
    pooled = layers.Dense(cfg.hidden, activation="tanh", kernel_initializer=init,
                          name="pooler")(net[:, 0, :])
    return layers.Dense(cfg.classes, kernel_initializer=init, name="logits")(pooled)


def conv_text(ids: tf.Tensor, training: bool, cfg: TextConfig = TextConfig(),
              mask: Optional[tf.Tensor] = None) -> tf.Tensor:
    """A 1-D conv text classifier (no attention): tf_keras `Embedding`, two
    `Conv1D` + ReLU, global max and global average pooling concatenated,
    a Dense ReLU and the logits."""
    del mask
    import tf_keras as keras  # pylint: disable=g-import-not-at-top
    layers = keras.layers
    keras.backend.set_learning_phase(1 if training else 0)
    init = keras.initializers.RandomUniform(-0.5, 0.5)
    net = layers.Embedding(cfg.vocab, cfg.hidden // 2, embeddings_initializer=init,
                           name="embedding")(ids)
    net = layers.Conv1D(cfg.hidden // 2, 3, padding="same", activation="relu", name="conv0")(net)
    net = layers.Conv1D(cfg.hidden // 2, 5, padding="same", activation="relu", name="conv1")(net)
    pooled = layers.Concatenate(name="pools")([
        layers.GlobalMaxPooling1D(name="max_pool")(net),
        layers.GlobalAveragePooling1D(name="avg_pool")(net)])
    net = layers.Dropout(cfg.dropout)(pooled, training=training)
    net = layers.Dense(cfg.hidden // 2, activation="relu", name="fc")(net)
    return layers.Dense(cfg.classes, name="logits")(net)


BUILDERS = {"bert_nn": bert_nn, "bert_keras": bert_keras, "conv_text": conv_text}


def build_graph(style: str, training: bool, cfg: TextConfig = TextConfig(),
                with_mask: bool = False, lookup: str = "gather", seed: int = 0):
    """One encoder in a new graph.

    Args:
      style: "bert_nn", "bert_keras" or "conv_text".
      training: dropout on (training graphs) or off (eval graphs).
      cfg: the encoder's size.
      with_mask: an int32 attention mask `[batch, seq]` as a second input.
      lookup: how `bert_nn` reads its table (see the module).
      seed: graph and tf_keras seed (the same weights in every build).

    Returns:
      (graph, ids placeholder, mask placeholder or None, logits).
    """
    g = tf.Graph()
    with g.as_default():
        tf1.set_random_seed(seed)
        if style != "bert_nn":
            import tf_keras as keras  # pylint: disable=g-import-not-at-top
            keras.utils.set_random_seed(seed)
        ids = tf1.placeholder(tf.int32, [None, cfg.seq], name="input_ids")
        mask = (tf1.placeholder(tf.int32, [None, cfg.seq], name="input_mask")
                if with_mask else None)
        kwargs = {"lookup": lookup} if style == "bert_nn" else {}
        logits = BUILDERS[style](ids, training, cfg, mask=mask, **kwargs)
        logits = tf.identity(logits, name="logits_out")
    return g, ids, mask, logits


def token_task(n: int, cfg: TextConfig = TextConfig(), seed: int = 0
               ) -> Tuple[np.ndarray, np.ndarray]:
    """Random sequences, label 1 where TARGET_TOKEN occurs (half of them).

    Every sequence draws its tokens from the vocabulary without the target;
    half (chosen at random) then get the target at 1 to 3 random positions.

    Returns:
      (ids int32 [n, seq], labels int32 [n]).
    """
    rng = np.random.RandomState(seed)
    others = np.array([t for t in range(cfg.vocab) if t != TARGET_TOKEN])
    ids = others[rng.randint(0, len(others), (n, cfg.seq))]
    labels = rng.randint(0, 2, n).astype(np.int32)
    for i in np.nonzero(labels)[0]:
        where = rng.choice(cfg.seq, rng.randint(1, 4), replace=False)
        ids[i, where] = TARGET_TOKEN
    return ids.astype(np.int32), labels
