"""Decoding in the programs: a prompt to text (`sampling`), a sequence-to-sequence model's inputs
to outputs (`seq2seq_decoding`), a model's per-example records (`example_decoding`).
`python -m pax_eqx.decode`, the end of training and decoded eval metrics run it; the strategies
themselves are model configs (pax_eqx.models.decode_strategies).
"""
