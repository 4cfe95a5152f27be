"""Evaluation: one eval run over Pax's reset_for_eval x eval_loop_num_batches table
(`eval_loop`), and the host-side metrics on what the model output (`eval_metrics` on scores,
`decoded_eval` on decoded text). `python -m pax_eqx.eval` and the training loop both run it.
"""
