"""Preparing a corpus once into ArrayRecord shards (`python -m pax_eqx.prepare_data`).

    config.py    PrepareConfig: the command's flags (input, format, tokenizer, layout, shards, runner)
    readers.py   corpus files -> documents: JSON lines (plain, .gz, .zst), Parquet, text files, a
                 Hugging Face `datasets` save_to_disk directory
    records.py   the bytes of one record (a document's tokens, or a packed row), written and read
    shards.py    which shard a document goes to, and writing one shard deterministically
    manifest.py  manifest.json: what a prepared directory holds, checked by the reader
    pipeline.py  the Apache Beam pipeline that ties them together (imports apache_beam)

Only pipeline.py needs the `[prepare]` extra (apache-beam); the reader side
(`pax_eqx.data.array_record_source`) needs manifest.py and records.py, which import numpy only.
"""
