"""The learner's networks (Keras): multilayer perceptrons for vectors, a convolutional torso for images; their numpy
twins, numpy_mlp_forward, numpy_cnn_forward and numpy_cnn_torso, are in algos.numpy_actor."""

import keras
import numpy as np

from algos.numpy_actor import numpy_cnn_forward, numpy_cnn_torso, numpy_mlp_forward
from algos.spaces import PRECISIONS, ObsSpec, conv_layers

__all__ = ["build_cnn", "build_cnn_torso", "build_head", "build_mlp", "numpy_cnn_forward", "numpy_cnn_torso",
           "numpy_mlp_forward"]


def build_mlp(in_dim: int, out_dim: int, hidden: tuple[int, ...], output_gain: float) -> keras.Model:
    """Dense MLP (N, in_dim) float32 -> (N, out_dim): tanh hidden layers, linear output.

    Orthogonal weights (gain sqrt(2) on hidden layers, output_gain on the output) and zero biases.
    model.weights is [W0, b0, W1, b1, ...] with W_i of shape (fan_in, fan_out), the layout
    numpy_mlp_forward expects.
    """
    inputs = keras.Input(shape=(in_dim,), dtype="float32")
    x = inputs
    for size in hidden:
        x = keras.layers.Dense(
            size,
            activation="tanh",
            kernel_initializer=keras.initializers.Orthogonal(gain=np.sqrt(2.0)),
            bias_initializer="zeros",
        )(x)
    outputs = keras.layers.Dense(
        out_dim,
        kernel_initializer=keras.initializers.Orthogonal(gain=output_gain),
        bias_initializer="zeros",
    )(x)
    return keras.Model(inputs, outputs)


def build_cnn(obs: ObsSpec, out_dim: int, output_gain: float, precision: str = PRECISIONS[0]) -> keras.Model:
    """Images (N, H, W, C) uint8 -> (N, out_dim): build_cnn_torso's layers, then a linear output (orthogonal, gain
    output_gain, zero bias). model.weights is [K0 (k, k, C, F0), b0, ..., W (flat, D), b (D,), W_out (D, out_dim),
    b_out], the layout numpy_cnn_forward expects."""
    inputs = keras.Input(shape=obs.shape, dtype="uint8")
    return keras.Model(inputs, build_head(out_dim, output_gain)(_torso_layers(obs, inputs, precision)))


def build_cnn_torso(obs: ObsSpec, precision: str = PRECISIONS[0]) -> keras.Model:
    """Images (N, H, W, C) uint8 -> (N, D) float32 features: pixels times obs.scale, the conv_layers torso (ReLU), a
    ReLU dense layer of D units. Orthogonal weights (gain sqrt(2)) and zero biases. model.weights is [K0 (k, k, C, F0),
    b0, ..., W (flat, D), b (D,)], the layout numpy_cnn_torso expects.

    ``precision`` "bfloat16": the layers compute in bfloat16 from float32 weights (Keras's mixed_bfloat16), and the
    features are cast back to float32; the weights, their gradients and everything after the torso stay float32."""
    inputs = keras.Input(shape=obs.shape, dtype="uint8")
    return keras.Model(inputs, _torso_layers(obs, inputs, precision))


def build_head(out_dim: int, output_gain: float) -> keras.layers.Dense:
    """A linear output layer of out_dim units: orthogonal weights of gain output_gain, zero biases."""
    return keras.layers.Dense(out_dim, kernel_initializer=keras.initializers.Orthogonal(gain=output_gain),
                              bias_initializer="zeros")


def _torso_layers(obs: ObsSpec, inputs: keras.KerasTensor, precision: str) -> keras.KerasTensor:
    """build_cnn_torso's layers applied to ``inputs``, computing in ``precision`` (PRECISIONS), float32 out."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    # Mixed: the variables are float32 (the same initial values, optimizer and checkpoints); each layer casts them
    # and its input to bfloat16 when it runs.
    policy = "mixed_bfloat16" if precision == "bfloat16" else "float32"
    convs, dense = conv_layers(obs.shape)
    # In the network, so that a batch stays uint8 (a quarter of float32's bytes) until each minibatch runs.
    x = keras.ops.cast(inputs, "float32") * obs.scale
    for filters, kernel, stride in convs:
        x = keras.layers.Conv2D(filters, kernel, strides=stride, activation="relu",
                                kernel_initializer=keras.initializers.Orthogonal(gain=np.sqrt(2.0)),
                                bias_initializer="zeros", dtype=policy)(x)
    x = keras.layers.Flatten(dtype=policy)(x)
    x = keras.layers.Dense(dense, activation="relu",
                           kernel_initializer=keras.initializers.Orthogonal(gain=np.sqrt(2.0)),
                           bias_initializer="zeros", dtype=policy)(x)
    return keras.ops.cast(x, "float32")
