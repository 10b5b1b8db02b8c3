"""Adam as one fused TensorFlow kernel per variable, for the learners' small networks.

On 64x64 networks an update is bound by the number of ops per gradient step, not by arithmetic. Keras's Adam builds
about 20 ops per variable and step; TensorFlow's ``ResourceApplyAdam`` kernel does the same update in one.
"""

import numpy as np
import tensorflow as tf


class FusedAdam:
    """Adam (Kingma and Ba 2015) with Keras's update rule and Keras's variable layout.

    ``variables`` is [iterations () int64, learning_rate () float32, m_0, v_0, m_1, v_1, ...] with m_i, v_i shaped
    like the i-th trained variable: the order keras.optimizers.Adam uses, so checkpoints written with either restore
    into the other. Per step t (counting from 1), for each variable w with gradient g:
    m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; w -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + epsilon).
    """

    def __init__(self, trained: list[tf.Variable], learning_rate: float, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-7) -> None:
        self.trained = trained
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="adam_iterations")
        self.learning_rate = tf.Variable(learning_rate, dtype=tf.float32, trainable=False, name="adam_learning_rate")
        self._beta_1 = tf.constant(beta_1, tf.float32)
        self._beta_2 = tf.constant(beta_2, tf.float32)
        self._epsilon = tf.constant(epsilon, tf.float32)
        self._moments = [
            (tf.Variable(np.zeros(w.shape, np.float32), trainable=False),
             tf.Variable(np.zeros(w.shape, np.float32), trainable=False))
            for w in trained
        ]
        self.variables = [self.iterations, self.learning_rate] + [slot for pair in self._moments for slot in pair]

    def apply(self, grads: list[tf.Tensor]) -> None:
        """One Adam step on ``trained`` with ``grads`` (same shapes, same order). Meant to run inside tf.function."""
        step = tf.cast(self.iterations + 1, tf.float32)
        beta_1_power = tf.pow(self._beta_1, step)
        beta_2_power = tf.pow(self._beta_2, step)
        for variable, (m, v), grad in zip(self.trained, self._moments, grads, strict=True):
            tf.raw_ops.ResourceApplyAdam(
                var=variable.handle, m=m.handle, v=v.handle, beta1_power=beta_1_power, beta2_power=beta_2_power,
                lr=self.learning_rate, beta1=self._beta_1, beta2=self._beta_2, epsilon=self._epsilon, grad=grad,
            )
        self.iterations.assign_add(1)
