"""A ResNet in your own code: compose it, train it on the digits for a few steps, evaluate it.

Run it as a script (`python docs/tutorials/resnet_on_digits.py`); the tests run it too. No
experiment, no CLI: the layers, the model contract and the Task are plain Python objects, and
the train step is one jitted pure function.
"""

import jax
import numpy as np

from pax_eqx.data import DataConfig, DigitsImagesSource, InputConfig, build_input, build_tokenizer
from pax_eqx.layers import ResNetBlockConfig, ResNetConfig
from pax_eqx.learners import AdamWConfig, LearnerConfig
from pax_eqx.metrics import HostAccumulator
from pax_eqx.models import ClassificationModelConfig
from pax_eqx.tasks.task import Task

# 1. A small ResNet for 8x8 images: a 3x3 stem, two stages of basic blocks, global pooling. The
#    classifier decides the trunk's input channels from its input shape.
trunk = ResNetConfig(
    blocks=(1, 1), channels=(16, 32), strides=(1, 2), stem="small", stem_channels=16, block=ResNetBlockConfig()
)
model_cfg = ClassificationModelConfig(input_shape=(8, 8, 1), num_classes=10, network=trunk)

# 2. A Task: the model, a learner, and (by default) the model's own loss, avg_xent.
task = Task(model_cfg, LearnerConfig(optimizer=AdamWConfig(), learning_rate=3e-3))
state = task.init_state(jax.random.PRNGKey(0))
train_step = jax.jit(task.train_step, donate_argnums=0)
eval_step = jax.jit(task.eval_step)

# 3. The digits as [8, 8, 1] images, through Pax's input contract (one host here).
data = DataConfig(
    source=DigitsImagesSource(),
    train=InputConfig(batch_size=64),
    eval=InputConfig(batch_size=64, shuffle=False, repeat=False, reset_for_eval=True),
)
tokenizer = build_tokenizer(data)  # images need none; every input is built with the experiment's
train_input, eval_input = build_input(data, "train", tokenizer), build_input(data, "eval", tokenizer)

# 4. Train: each step returns the new state and weighted metrics (value, weight) pairs.
for step in range(60):
    state, out = train_step(state, train_input.get_next())
print(f"train loss after 60 steps: {float(out.metrics['total_loss'].value):.3f}")

# 5. Evaluate one epoch of held-out images. Padded rows weigh 0, so merging the batches'
#    metrics by weight counts every image exactly once.
totals = HostAccumulator()
for batch in eval_input:
    totals.add(jax.device_get(eval_step(state, batch).metrics))
result = totals.result()
print(f"eval images: {int(result['accuracy'].weight)}")
print(f"eval accuracy: {float(np.asarray(result['accuracy'].value)):.3f}")
