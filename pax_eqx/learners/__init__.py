"""pax_eqx.learners: Pax's Learner on optax: optimizers, schedules, clipping, weight-decay masks, EMA.

tx = build_optimizer(learner_cfg, params)        # one optax.GradientTransformation
cfg = pax_adam(learning_rate=1e-3, ...)          # Praxis' Adam, with Pax's names
lr = learning_rate_fn(learner_cfg)(step)         # the rate applied at `step`, to log
n = skipped_steps(opt_state)                     # steps skipped for a NaN/Inf gradient
ema = ema_update(ema, params, learner_cfg.ema_decay)
"""

from pax_eqx.learners.decay_mask import default_decay_mask
from pax_eqx.learners.ema import ema_init, ema_update
from pax_eqx.learners.optimizer_configs import (
    AdafactorConfig,
    AdamConfig,
    AdamWConfig,
    LionConfig,
    OptimizerConfig,
    SgdConfig,
)
from pax_eqx.learners.optimizers import LearnerConfig, build_optimizer, learning_rate_fn, pax_adam, skipped_steps
from pax_eqx.learners.schedules import (
    ConstantSchedule,
    CosineSchedule,
    ExponentialSchedule,
    LinearSchedule,
    PiecewiseSchedule,
    RsqrtSchedule,
    ScheduleConfig,
    build_schedule,
    linear_rampup_cosine_decay,
    linear_rampup_exponential_decay,
)
