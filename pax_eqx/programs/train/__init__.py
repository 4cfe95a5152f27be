"""Training: `train_loop.train`, the host loop of `python -m pax_eqx.train`, and what only a
training run does: how it opens (`opening`, `init_from`, `state_from_params`), the calls in flight,
stopping (`stop_flag`, `early_stopping`), PGLE, and what it says of itself (`run_report`).

It evaluates and decodes during training through the rooms below it (`evaluate`, `decode`).
"""
