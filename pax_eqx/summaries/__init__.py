"""Summaries: TensorBoard events and DIR/metrics.jsonl, loss plots, and the progress bar.

from pax_eqx.summaries import SummaryWriter, write_plots, Progress
"""

from pax_eqx.summaries.plots import write_plots
from pax_eqx.summaries.progress import Progress
from pax_eqx.summaries.writer import SummaryWriter, read_metrics
