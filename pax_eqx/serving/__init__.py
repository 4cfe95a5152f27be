"""Serving a trained or imported model: continuous batching over decode slots (`engine`), the
two compiled programs it runs (`slot_programs`), per-request sampling as traced values
(`row_sampling`), and the request contract (`requests`). The HTTP server (`pax_eqx.serve`)
and the `jax.export` artifacts (`pax_eqx.export`) sit on top of these.
"""
