"""Serving a trained or imported model: continuous batching over decode slots (`engine`), the
two compiled programs it runs (`slot_programs`), per-request sampling as traced values
(`row_sampling`), and the request contract (`requests`). The HTTP server (`pax_eqx.serve`)
and the `jax.export` artifacts (`pax_eqx.export`) sit on top of these.

The server's parts: the app (`http_app`: routes, streaming, errors), the OpenAI API's bodies
(`openai_api`), what the app asks of a model (`backends`; an encoder-decoder's
`seq2seq_backend`, a classifier's `classifier_backend`), chat templates (`chat_template`),
/metrics (`prometheus_text`) and the page at / (`page.html`).
"""
