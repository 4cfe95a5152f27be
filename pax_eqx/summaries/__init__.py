"""Summaries: TensorBoard events and DIR/metrics.jsonl, loss plots, and the progress bar.

    from pax_eqx.summaries import SummaryWriter, write_plots, Progress

What each writes into the job dir is in its module's docstring.
"""

from pax_eqx.summaries.plots import write_overlay, write_plots
from pax_eqx.summaries.progress import Progress
from pax_eqx.summaries.scalars import mean_summaries, step_scalars, with_loss_alias
from pax_eqx.summaries.writer import SummaryWriter, read_metrics
