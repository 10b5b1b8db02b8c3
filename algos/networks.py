"""The multilayer perceptrons of the learner (Keras); their numpy twin, numpy_mlp_forward, is in algos.numpy_actor."""

import keras
import numpy as np

from algos.numpy_actor import numpy_mlp_forward

__all__ = ["build_mlp", "numpy_mlp_forward"]


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
